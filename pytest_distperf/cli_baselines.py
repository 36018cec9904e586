"""`distperf baselines list|show|rename|prune|diff`: a team's baselines kept without editing
JSON by hand. Writes go through BaselineStore.rewrite (atomic, under the store's lock); a file
that cannot be parsed is named and left as it is (status 1); bad input exits 2 naming it."""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

from pytest_distperf.judge.gate import BASELINE_DIR_NAME
from pytest_distperf.judge.tolerance import RUNS_TO_SETTLE, largest_drop
from pytest_distperf.store.diff import diff_markdown, diff_rows, diff_text
from pytest_distperf.store.entry import BaselineEntry
from pytest_distperf.store.identity import split_identity
from pytest_distperf.store.snapshot import Snapshot, SnapshotError, read_directory, read_source
from pytest_distperf.store.store import BaselineFileError, BaselineStore
from pytest_distperf.work import work_cell

UNREADABLE = 1  # some file could not be parsed: named, left as it is


class BaselinesError(Exception):
    """Bad input to a `distperf baselines` command; the message names it."""


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "baselines",
        help="list, show, rename, prune and diff the stored baselines",
        description="Keep a baseline directory: list its entries, show one's history, rename a "
        "moved test, prune old or orphaned entries, diff two directories or commits.",
    )
    commands = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    directory = {
        "nargs": "?",
        "default": BASELINE_DIR_NAME,
        "metavar": "DIR",
        "help": f"baseline directory (default: {BASELINE_DIR_NAME})",
    }

    def command(name: str, text: str) -> argparse.ArgumentParser:
        made = commands.add_parser(name, help=text, description=text)
        made.add_argument("--json", action="store_true", help="print JSON instead of text")
        return made

    listing = command(
        "list", "every entry per topology key: runs, last recorded, median, drift, work"
    )
    show = command("show", "one entry's history: each recorded run's median, date and commit")
    show.add_argument("test", metavar="TEST", help="a test id, its node id, or a part of it")
    rename = command("rename", "rename a test's entries, keeping their history (OLD: a prefix)")
    rename.add_argument("old", metavar="OLD", help="a test id, or a prefix such as a file path")
    rename.add_argument("new", metavar="NEW", help="what replaces OLD")
    prune = command(
        "prune",
        "list entries recorded before an age or matching a pattern; remove them with --apply",
    )
    which = prune.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--older-than",
        type=_days,
        metavar="DAYS",
        help="entries last recorded more than DAYS days ago",
    )
    which.add_argument(
        "--match",
        metavar="PATTERN",
        help="entries whose test id contains "
        "PATTERN, or matches it as a shell pattern (*, ?, [...])",
    )
    prune.add_argument("--apply", action="store_true", help="remove them (default: list only)")
    for made in (listing, show, rename, prune):
        made.add_argument("directory", **directory)
    diff = command(
        "diff",
        "per test, old and new median and work between two directories or "
        "commits (REF:DIR, read with git show)",
    )
    diff.add_argument("old", metavar="OLD", help="a directory, or REF:DIR (e.g. HEAD:baselines)")
    diff.add_argument("new", metavar="NEW", help="a directory, or REF:DIR")
    diff.add_argument("--markdown", action="store_true", help="a Markdown table (for a review)")


def _days(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of days, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of days >= 0, got {text!r}")
    return value


def cmd_baselines(args: argparse.Namespace) -> int:
    action: Callable[[argparse.Namespace], int] = {
        "list": _list,
        "show": _show,
        "rename": _rename,
        "prune": _prune,
        "diff": _diff,
    }[args.action]
    try:
        return action(args)
    except SnapshotError as error:
        raise BaselinesError(str(error)) from None
    except (OSError, TimeoutError) as error:  # an unwritable directory, a lock held too long
        raise BaselinesError(f"{type(error).__name__}: {error}") from None


def _row(key: str, entry: BaselineEntry) -> dict[str, Any]:
    runs = entry.run_medians or (entry.median,)
    test, workload = split_identity(entry.test_id)
    return {
        "topology_key": key,
        "test_id": entry.test_id,
        "test": test,
        "workload": workload,
        "recorded_runs": len(runs),
        "last_recorded": entry.recorded_at,
        "commit": entry.commit,
        "median_tokens_per_sec": entry.median,
        "drift": largest_drop(runs) if len(runs) >= RUNS_TO_SETTLE else None,
        "work": work_cell(entry.work),
    }


def _report_unreadable(snapshot: Snapshot) -> int:
    for error in snapshot.unreadable:
        print(f"distperf baselines: {error} (left as it is)", file=sys.stderr)
    return UNREADABLE if snapshot.unreadable else 0


def _unreadable_json(snapshot: Snapshot) -> list[dict[str, str]]:
    return [{"file": str(e.path), "problem": e.problem} for e in snapshot.unreadable]


def _list(args: argparse.Namespace) -> int:
    snapshot = read_directory(args.directory)
    rows = {
        key: [_row(key, e) for _, e in sorted(entries.items())]
        for key, entries in sorted(snapshot.entries.items())
    }
    if args.json:
        _print_json(args, snapshot, topology_keys=rows)
    else:
        for key, key_rows in rows.items():
            print(f"{key} ({len(key_rows)} entr{'y' if len(key_rows) == 1 else 'ies'})")
            for row in key_rows:
                drift = "-" if row["drift"] is None else f"{row['drift']:.1%}"
                print(f"  {row['test']}")
                print(
                    f"      [{row['workload']}] {row['recorded_runs']} run(s), last "
                    f"{row['last_recorded']} at {_commit(row['commit'])}; median "
                    f"{row['median_tokens_per_sec']:.4g} tok/s, drift {drift}; work "
                    f"{row['work']}"
                )
        if not rows:
            print(f"{args.directory}: no baselines recorded there")
    return _report_unreadable(snapshot)


def _show(args: argparse.Namespace) -> int:
    snapshot = read_directory(args.directory)
    found = _matching(snapshot, args.test)
    shown = []
    for key, entry in found:
        runs = entry.run_medians or (entry.median,)
        pad = len(runs)
        dates = (None,) * (pad - len(entry.run_recorded_at)) + entry.run_recorded_at[-pad:]
        commits = (None,) * (pad - len(entry.run_commits)) + entry.run_commits[-pad:]
        history = [
            {"median_tokens_per_sec": m, "recorded_at": d, "commit": c}
            for m, d, c in zip(runs, dates, commits, strict=True)
        ]
        shown.append({**_row(key, entry), "samples": list(entry.samples), "runs": history})
    if args.json:
        _print_json(args, snapshot, entries=shown)
    for item in [] if args.json else shown:
        print(f"{item['test_id']}\n  topology key {item['topology_key']}; work {item['work']}")
        for number, run in enumerate(item["runs"], 1):
            date = run["recorded_at"] or "(date not recorded)"
            rate = run["median_tokens_per_sec"]
            print(f"  run {number:>2}: {rate:.4g} tok/s  {date}  {_commit(run['commit'])}")
    return _report_unreadable(snapshot)


def _matching(snapshot: Snapshot, test: str) -> list[tuple[str, BaselineEntry]]:
    """The entries named by `test`: its exact id, else its node id, else ids containing it;
    one test (on each topology key that has it), or a BaselinesError listing the candidates."""
    every = [(k, e) for k, entries in sorted(snapshot.entries.items()) for e in entries.values()]
    for rule in (
        lambda e: e.test_id == test,
        lambda e: split_identity(e.test_id)[0] == test,
        lambda e: test in e.test_id,
    ):
        found = [(key, e) for key, e in every if rule(e)]
        ids = sorted({e.test_id for _, e in found})
        if len(ids) == 1:
            return found
        if len(ids) > 1:
            listed = "\n  ".join(ids)
            raise BaselinesError(f"{test!r} names {len(ids)} tests; give one:\n  {listed}")
    raise BaselinesError(f"no entry in {snapshot.source} matches {test!r}")


def _rewrite_all(
    directory: str,
    select: Callable[[BaselineEntry], bool],
    change: Callable[[dict[str, BaselineEntry], list[str]], dict[str, BaselineEntry]],
    dry_run: bool = False,
) -> tuple[dict[str, list[str]], Snapshot]:
    """Apply `change(entries, selected ids)` to every readable file with a selected entry,
    under its lock (`dry_run`: to none); the ids selected per topology key."""
    snapshot = read_directory(directory)
    store = BaselineStore(directory)
    done: dict[str, list[str]] = {}
    for key, read in snapshot.entries.items():
        if dry_run:
            done[key] = sorted(t for t, e in read.items() if select(e))
            continue

        def locked(entries: dict[str, BaselineEntry], key: str = key) -> dict[str, BaselineEntry]:
            chosen = sorted(t for t, e in entries.items() if select(e))
            done[key] = chosen
            return change(entries, chosen) if chosen else entries

        try:
            store.rewrite(key, locked)
        except BaselineFileError as error:  # changed since it was read; left as it is
            snapshot = replace(snapshot, unreadable=(*snapshot.unreadable, error))
        except FileNotFoundError:
            continue
    return {key: ids for key, ids in done.items() if ids}, snapshot


def _rename(args: argparse.Namespace) -> int:
    old, new = args.old, args.new
    if not old:
        raise BaselinesError("OLD is empty: name a test id or a prefix of one")

    def renamed(test_id: str) -> str:
        return new + test_id[len(old) :]

    def change(entries: dict[str, BaselineEntry], ids: list[str]) -> dict[str, BaselineEntry]:
        kept = {t: e for t, e in entries.items() if t not in ids}
        for test_id in ids:
            target = renamed(test_id)
            if target in kept:
                raise BaselinesError(
                    f"{target!r} exists already; renaming {test_id!r} would replace it"
                )
            try:
                kept[target] = replace(entries[test_id], test_id=target)
            except ValueError as error:
                raise BaselinesError(f"NEW {new!r}: {error}") from None
        return kept

    snapshot = read_directory(args.directory)
    for entries in snapshot.entries.values():  # refuse before writing any file
        change(entries, [t for t in entries if t.startswith(old)])
    done, snapshot = _rewrite_all(args.directory, lambda e: e.test_id.startswith(old), change)
    if not done and not snapshot.unreadable:
        raise BaselinesError(f"no entry in {args.directory} starts with {old!r}")
    moves = {key: {t: renamed(t) for t in ids} for key, ids in done.items()}
    if args.json:
        _print_json(args, snapshot, renamed=moves)
    for key, pairs in [] if args.json else moves.items():
        for before, after in pairs.items():
            print(f"{key}: {before} -> {after}")
    return _report_unreadable(snapshot)


def _prune(args: argparse.Namespace) -> int:
    if args.older_than is not None:
        cutoff = datetime.now(timezone.utc) - timedelta(days=args.older_than)
        select = lambda e: _recorded(e) < cutoff  # noqa: E731
        reason = f"last recorded more than {args.older_than:g} days ago"
    else:
        pattern = args.match
        select = lambda e: pattern in e.test_id or fnmatch.fnmatchcase(e.test_id, f"*{pattern}*")  # noqa: E731
        reason = f"matching {pattern!r}"
    removed, snapshot = _rewrite_all(
        args.directory,
        select,
        lambda entries, ids: {t: e for t, e in entries.items() if t not in ids},
        dry_run=not args.apply,
    )
    if args.json:
        _print_json(args, snapshot, applied=args.apply, entries=removed)
    else:
        count = sum(map(len, removed.values()))
        verb = "removed" if args.apply else "would be removed (pass --apply to remove them)"
        print(f"{count} entr{'y' if count == 1 else 'ies'} {reason} {verb}")
        for key, ids in sorted(removed.items()):
            for test_id in ids:
                print(f"  {key}: {test_id}")
    return _report_unreadable(snapshot)


def _recorded(entry: BaselineEntry) -> datetime:
    text = entry.recorded_at
    return datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)


def _diff(args: argparse.Namespace) -> int:
    old, new = read_source(args.old), read_source(args.new)
    rows = diff_rows(old, new)
    if args.json:
        unreadable = _unreadable_json(old) + _unreadable_json(new)
        document = {"old": old.source, "new": new.source, "tests": rows, "unreadable": unreadable}
        print(json.dumps({**document, "notes": [*old.notes, *new.notes]}, indent=2, sort_keys=True))
    else:
        lines = diff_markdown(rows) if args.markdown else diff_text(rows)
        shown = sum(row["status"] != "unchanged" for row in rows)
        print(
            f"distperf baselines diff {old.source} -> {new.source}: {shown} of {len(rows)} "
            "entries differ"
        )
        print("\n".join([*lines, *(f"note: {n}" for n in [*old.notes, *new.notes])]))
    return max(_report_unreadable(old), _report_unreadable(new))


def _commit(commit: str | None) -> str:
    return commit[:12] if commit else "(no commit)"


def _print_json(args: argparse.Namespace, snapshot: Snapshot, **document: Any) -> None:
    """The command's JSON: its directory, `document`, and the files it could not read."""
    document |= {"directory": str(args.directory), "unreadable": _unreadable_json(snapshot)}
    print(json.dumps(document, indent=2, sort_keys=True))
