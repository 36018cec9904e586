"""Orphaned baselines: entries of this machine's file that no collected test matched, in a
session where some tests found none. A moved suite must never go silently without baselines, so
the session names both lists, the likely cause and the command that keeps the history. Pure."""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from pytest_distperf.jsonfields import json_value
from pytest_distperf.store.identity import SEPARATOR, split_identity

WORKLOAD_CHANGED = "the same test with another parametrization or workload"
PATH_MOVED = (
    "the same file named from another directory (the rootdir or the working directory moved, "
    "or an identity stored by an older pytest-distperf)"
)
FILE_RENAMED = "the test file was renamed or moved"
UNMATCHED = (
    "no collected test matches it: the test was removed or renamed, or its file was not "
    "collected in this session"
)


@dataclass(frozen=True)
class Suggestion:
    """What an orphaned entry likely is, and the command that acts on it."""

    orphan: str
    cause: str
    test: str | None = None  # the test without a baseline it likely belongs to
    command: str | None = None


@dataclass(frozen=True)
class Orphans:
    """Named as the JSON report's `baseline_orphans` names them."""

    topology_key: str
    baseline_file: str
    tests_without_baseline: tuple[str, ...]  # identities of the tests that found no entry
    orphaned_entries: tuple[str, ...]  # entries that no collected test matched
    suggestions: tuple[Suggestion, ...]

    @property
    def likely_cause(self) -> str:
        return "; ".join(dict.fromkeys(s.cause for s in self.suggestions))

    @property
    def commands(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.command for s in self.suggestions if s.command))

    def to_json(self) -> dict[str, Any]:
        both = {"likely_cause": self.likely_cause, "commands": self.commands}
        return json_value(asdict(self) | both)

    def lines(self) -> list[str]:
        """The terminal summary's warning."""
        missing, orphaned = self.tests_without_baseline, self.orphaned_entries
        one = len(orphaned) == 1
        lines = [
            f"{len(missing)} test(s) found no baseline, while "
            f"{len(orphaned)} entr{'y' if one else 'ies'} of this machine's baseline file "
            f"{self.baseline_file} match{'es' if one else ''} no collected test:",
            *(f"  no baseline:  {test_id}" for test_id in missing),
            *(f"  orphaned:     {test_id}" for test_id in orphaned),
        ]
        for s in self.suggestions:  # the node ids alone: the workloads are listed above
            test = f" ({split_identity(s.test)[0]})" if s.test else ""
            lines.append(f"  likely: {split_identity(s.orphan)[0]}: {s.cause}{test}")
        lines += [f"  run: {command}" for command in self.commands]
        return lines


def find_orphans(
    entry_ids: Iterable[str],
    looked_up: Mapping[str, tuple[str, bool]],
    collected: Iterable[str],
    *,
    topology_key: str,
    baseline_file: str,
    directory: str,
) -> Orphans | None:
    """The orphans of a session, or None when every test found its entry or every entry
    matched a test. `looked_up`: identity -> (older form, found) of each run (judge/gate.py);
    `collected`: node ids of the tests that did not run, whose entries are not orphans."""
    ran = set(looked_up) | {legacy for legacy, _ in looked_up.values()}
    ran_nodeids = {split_identity(test_id)[0] for test_id in ran}
    others = set(collected) - ran_nodeids
    orphaned = sorted(e for e in entry_ids if e not in ran and split_identity(e)[0] not in others)
    missing = {i: legacy for i, (legacy, found) in sorted(looked_up.items()) if not found}
    if not orphaned or not missing:
        return None
    suggestions = tuple(_suggestion(o, missing, directory) for o in orphaned)
    return Orphans(topology_key, baseline_file, tuple(missing), tuple(orphaned), suggestions)


def _suggestion(orphan: str, missing: Mapping[str, str], directory: str) -> Suggestion:
    node, workload = split_identity(orphan)
    for test_id, legacy in missing.items():  # the same node id first: the clearest cause
        if node in (split_identity(test_id)[0], split_identity(legacy)[0]):
            return Suggestion(orphan, WORKLOAD_CHANGED, test_id)
    old, _, name = node.partition(SEPARATOR)
    for test_id in missing:
        test_node, test_workload = split_identity(test_id)
        new, _, test_name = test_node.partition(SEPARATOR)
        if test_workload != workload or test_name != name:
            continue
        moved = new.endswith(f"/{old}") or old.endswith(f"/{new}")
        command = _command("rename", old, new, directory)
        return Suggestion(orphan, PATH_MOVED if moved else FILE_RENAMED, test_id, command)
    return Suggestion(orphan, UNMATCHED, None, _command("prune", directory, "--match", node))


def _command(*args: str) -> str:
    return shlex.join(["distperf", "baselines", *args])
