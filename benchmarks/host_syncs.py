"""Host syncs of the scoring pass and of an optimiser step: how often the host waits for the device.

    python benchmarks/host_syncs.py

On a GPU a read of a device value (`.item()`, `bool(t)`, ...), a blocking host-to-device copy (`torch.tensor(list,
device=...)`, a list as an index) and a boolean-mask index wait for all queued work. torch's own detector works on
CUDA only, so this patches those calls and counts them on CPU (an upper bound: host tensors count too), in
grpo_base.old_logprobs() + update() over the same rows cut into 2, 4 and 8 micro-batches, padded and packed:
a fixed part and a part per micro-batch. Stored in docs/bench/host_syncs.json; docs/SCALING.md's block is
written from it.
"""

import argparse
import collections
import functools
import sys
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks import stored_run  # noqa: E402

STORED = stored_run.BENCH / "host_syncs.json"
DOC = ROOT / "docs" / "SCALING.md"
BEGIN, END, FIND = stored_run.markers("host syncs", "benchmarks/host_syncs.py", "docs/bench/host_syncs.json")
MICRO_BATCHES = (2, 4, 8)

READS = ["item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy"]
COUNTS: collections.Counter = collections.Counter()


def caller() -> str | None:
    """The first frame outside torch and this file: the line that asked for the sync. None inside
    torch.optim: its step counters are host tensors on CUDA too (no sync)."""
    stack = traceback.extract_stack()[:-2]
    if any("/torch/optim/" in frame.filename for frame in stack):
        return None
    for frame in reversed(stack):
        path = frame.filename
        if "/torch/" in path or path == __file__:
            continue
        where = Path(path)
        where = where.relative_to(ROOT) if where.is_relative_to(ROOT) else Path(*where.parts[-2:])
        return f"{where}:{frame.name}"
    return "?"


def count() -> None:
    if where := caller():
        COUNTS[where] += 1


def patch(on_sync=count) -> None:
    """From now on, call `on_sync()` at each call that would make the host wait for a GPU (module docstring)."""
    for name in READS:
        original = getattr(torch.Tensor, name)

        @functools.wraps(original)
        def counted(self, *a, __original=original, **k):
            on_sync()
            return __original(self, *a, **k)

        setattr(torch.Tensor, name, counted)
    getitem, setitem, tensor = torch.Tensor.__getitem__, torch.Tensor.__setitem__, torch.tensor

    def blocking(i) -> bool:  # a Python list is copied to the device first; a boolean mask's size is read back
        return isinstance(i, list) or (torch.is_tensor(i) and i.dtype == torch.bool)

    def listed(index) -> bool:
        return blocking(index) or (isinstance(index, tuple) and any(blocking(i) for i in index))

    def counted_getitem(self, index):
        if listed(index):
            on_sync()
        return getitem(self, index)

    def counted_setitem(self, index, value):
        if listed(index):
            on_sync()
        return setitem(self, index, value)

    def counted_tensor(data, *a, **k):  # host data copied to a device, blocking
        if k.get("device") is not None:
            on_sync()
        return tensor(data, *a, **k)

    torch.Tensor.__getitem__ = counted_getitem
    torch.Tensor.__setitem__ = counted_setitem
    torch.tensor = counted_tensor


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(STORED), help="where the run is stored ('' for nowhere)")
    p.add_argument("--doc", default=str(DOC), help="the page whose block is written ('' for none)")
    p.add_argument("--render_only", action="store_true", help="write the page's block from the stored run")
    a = p.parse_args()
    if a.render_only:
        return write_doc(stored_run.load(Path(a.out)), a.doc)
    record = stored_run.start(" ".join(["python benchmarks/host_syncs.py", *sys.argv[1:]]))
    record["rows"], record["layouts"] = count_layouts()
    for layout, totals in record["layouts"].items():
        print(f"{layout} layout:\n" + "\n".join(table(totals)) + "\n")
    if a.out:
        write_doc(stored_run.finish(record, Path(a.out)), a.doc)


def count_layouts() -> tuple[int, dict]:
    """(rows, {layout: {micro-batches: {where: host syncs}}}) of old_logprobs() + update() over the same rows."""
    from step_time import demo_batch, update_session

    import grpo_base

    n, G = 64, 8
    model, batch = demo_batch(n)
    old = {"logp": -torch.rand(batch["completion_mask"].shape)}
    old["ref_logp"] = torch.zeros_like(old["logp"])
    rewards = torch.randint(0, 2, (n,)).float()
    rewards[::G], rewards[1::G] = 0.0, 1.0  # every group mixed: every row is trained
    adv = grpo_base.group_advantages(rewards, G)
    patch()
    layouts = {}
    for layout in ("padded", "packed"):  # packed: --padding_free
        totals = {}
        for micro_batches in MICRO_BATCHES:
            s, args = update_session(model, micro_batch_size=n // micro_batches), grpo_base.Args(group_size=G)
            s.ref_model, s.layout = None, layout
            grpo_base.update(s, batch, old, adv, None, args, step=0)  # warm-up
            COUNTS.clear()
            grpo_base.old_logprobs(s, batch, args)
            grpo_base.update(s, batch, old, adv, None, args, step=0)
            totals[str(micro_batches)] = dict(COUNTS)
        layouts[layout] = totals
    return n, layouts


def table(totals: dict) -> list[str]:
    """One layout's counts by where the call was made: at 2, 4 and 8 micro-batches, per micro-batch, fixed."""
    L = ["| called from | 2 micro-batches | 4 | 8 | per micro-batch | fixed |", "|---|---|---|---|---|---|"]
    where = sorted(set().union(*totals.values()))
    for w in where + ["total"]:
        c = [sum(totals[str(m)].values()) if w == "total" else totals[str(m)].get(w, 0) for m in MICRO_BATCHES]
        per_mb = (c[2] - c[0]) / 6
        L.append(f"| {w} | {c[0]} | {c[1]} | {c[2]} | {per_mb:g} | {c[0] - 2 * per_mb:g} |")
    return L


def render(record: dict) -> str:
    """docs/SCALING.md's block: each layout's counts, from the stored run."""
    L = [
        f"Stored in `docs/bench/host_syncs.json`: {stored_run.conditions(record)}. Host syncs in "
        f"`grpo_base.old_logprobs()` + `update()` of {record['rows']} rows of the demo model, one optimiser step, "
        "counted on CPU by patching the calls (an upper bound: host tensors count too):"
    ]
    for layout, totals in record["layouts"].items():
        L += ["", f"{layout} layout" + (" (`--padding_free`)" if layout == "packed" else "") + ":", ""]
        L += table(totals)
    return "\n".join(L)


def write_doc(record: dict, doc: str) -> None:
    if doc:
        stored_run.write_between(Path(doc), BEGIN, END, render(record), "host-syncs", FIND)
        print(f"wrote {doc}'s host-sync tables")


if __name__ == "__main__":
    main()
