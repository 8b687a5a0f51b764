"""Dataset preparation commands (`python -m data.prepare`) and shipped data files."""
