"""What a training step of the scripts executes and what a run needs to keep your work; no method's idea lives
here. Start at `session.py` (what `main()` opens) and follow its imports."""
