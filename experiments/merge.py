"""Merging the parts of one experiment (`specula experiment run --part I/N`, one DIR each) into one
run's directory, which the report then reads as it reads any run's.

A part's run.json has "part": {"index", "count", "keys", "sweep_points"}. The parts merge when they
hold the same spec (spec_hash), split the same way (count), every index from 0 to count - 1 once,
and each is complete: a results line for every one of its keys and repeats. Anything else is a
ReportError naming the DIRs and parts at fault. The merged run.json is part 0's without "part", with
"points" the whole sweep's and "merged_from" listing each part's DIR, commit, machine and date; the
merged results.jsonl holds every part's lines, repeat-major (as a run writes them), part by part.
"""
import json
import os

try:
    from experiments import results
except ImportError:  # run as a script: its own directory is on sys.path
    import results

ReportError = results.ReportError


def _part_of(directory):
    if not os.path.isdir(directory):
        raise ReportError(f"{directory}: no such directory")
    if not os.path.exists(os.path.join(directory, "run.json")):
        raise ReportError(f"{directory}: no run.json; not the output of `specula experiment run --part I/N`")
    run = results.load_run(directory)
    part = run.get("part")
    if not isinstance(part, dict) or not all(isinstance(part.get(k), int) for k in ("index", "count")) \
            or not isinstance(part.get("keys"), list):
        raise ReportError(f"{directory}: holds a whole run, not a part (experiment run --part I/N); "
                          "report it alone")
    return run, part


def _lines(directory, run, part):
    """The part's results lines, checked complete: one per key and repeat."""
    path = os.path.join(directory, "results.jsonl")
    started = os.path.isfile(path) and os.path.getsize(path) > 0  # no file, or empty: not run yet
    records = results.load_results(path) if started else []
    want = {(k, r) for k in part["keys"] for r in range(int(run.get("repeats", 1)))}
    have = {(rec["key"], rec.get("repeat", 0)) for rec in records}
    if have - want:
        raise ReportError(f"{path}: holds runs that are not part {part['index']}/{part['count']}'s "
                          f"(e.g. {sorted(have - want)[0][0]})")
    if want - have:
        raise ReportError(f"{directory}: part {part['index']}/{part['count']} is incomplete: {len(have)} of "
                          f"{len(want)} runs; run the same `experiment run --part` again to finish it")
    return records


def merge_parts(dirs, out_dir):
    """Checks the parts in `dirs` and writes the merged run.json and results.jsonl into out_dir."""
    parts = [(d,) + _part_of(d) for d in dirs]
    d0, run0, part0 = parts[0]
    count = part0["count"]
    by_index = {}
    for d, run, part in parts:
        if run.get("spec_hash") != run0.get("spec_hash"):
            raise ReportError(f"{d} holds part {part['index']}/{part['count']} of another spec "
                              f"({run.get('spec_path')}, hash {run.get('spec_hash')}) than {d0} "
                              f"({run0.get('spec_path')}, hash {run0.get('spec_hash')})")
        if part["count"] != count:
            raise ReportError(f"{d} is part {part['index']}/{part['count']} and {d0} part {part0['index']}/{count}: "
                              "parts of different splits")
        if part["index"] in by_index:
            raise ReportError(f"{by_index[part['index']][0]} and {d} are both part {part['index']}/{count}")
        by_index[part["index"]] = (d, run, part)
    missing = [i for i in range(count) if i not in by_index]
    if missing:
        have = ", ".join(f"{d}: part {p['index']}/{count}" for d, _, p in parts)
        raise ReportError(f"part {', '.join(f'{i}/{count}' for i in missing)} missing (have {have})")
    records = []
    for i in range(count):
        d, run, part = by_index[i]
        records += [(rec.get("repeat", 0), i, n, rec) for n, rec in enumerate(_lines(d, run, part))]
    records.sort(key=lambda x: x[:3])
    merged = {k: v for k, v in run0.items() if k != "part"}
    merged["points"] = part0.get("sweep_points", sum(len(p["keys"]) for _, _, p in parts))
    merged["merged_from"] = [{"dir": os.path.abspath(by_index[i][0]), "part": f"{i}/{count}",
                              **{k: by_index[i][1].get(k) for k in ("git_commit", "cpu", "date")}}
                             for i in range(count)]
    if os.path.abspath(out_dir) in {os.path.abspath(d) for d in dirs}:
        raise ReportError(f"--out: {out_dir} is one of the parts; the merged run needs a directory of its own")
    try:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "run.json"), "w", encoding="utf-8") as f:
            json.dump(merged, f, indent=2)
            f.write("\n")
        with open(os.path.join(out_dir, "results.jsonl"), "w", encoding="utf-8") as f:
            f.writelines(json.dumps(rec) + "\n" for *_, rec in records)
    except OSError as e:
        raise ReportError(f"{e.filename or out_dir}: cannot write ({e.strerror})") from None
    return out_dir
