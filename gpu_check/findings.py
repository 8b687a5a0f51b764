"""What one part of the first GPU run found (gpu_check/first_run.py): figures, checks, notes and small
tables, as JSON. A check that fails, or a step that raises inside `attempt`, marks the part failed without
stopping the part's other steps."""

import traceback


def error_tail(error: BaseException, lines: int = 8) -> str:
    """The last lines of an exception's traceback: where it failed and why."""
    return "\n".join("".join(traceback.format_exception(error)).strip().splitlines()[-lines:])


class Findings:
    def __init__(self):
        self.figures: dict = {}
        self.checks: dict = {}
        self.notes: list[str] = []
        self.tables: list[dict] = []

    def figure(self, name: str, value) -> None:
        self.figures[name] = value

    def check(self, name: str, ok: bool, detail="") -> None:
        self.checks[name] = {"ok": bool(ok), "detail": str(detail)}

    def note(self, text: str) -> None:
        self.notes.append(text)

    def table(self, title: str, header: list[str], rows: list[list]) -> None:
        self.tables.append({"title": title, "header": header, "rows": rows})

    def attempt(self, name: str, step, *args) -> None:
        """Run `step(self, *args)`; an exception becomes the failed check `name` with its traceback's tail."""
        try:
            step(self, *args)
        except Exception as e:  # noqa: BLE001 - one step's failure must not stop the part's others
            self.check(name, False, error_tail(e))

    def record(self) -> dict:
        return {"figures": self.figures, "checks": self.checks, "notes": self.notes, "tables": self.tables}
