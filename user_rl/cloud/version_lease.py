"""Policy version numbers that name one set of weights forever, across learner crashes.

A learner that crashes after publishing versions 1..7 and resumes from a checkpoint taken at
version 5 must not publish a different actor as version 6: an edge that acted with the old 6
would have its transitions labelled with weights that no longer exist. Before any version is
published, a block of versions is reserved in a small file in the run directory (written
atomically and fsynced); a resumed learner starts above everything ever reserved, so above
everything ever published. A crash wastes at most one block of numbers.
"""

from __future__ import annotations

from pathlib import Path

from user_rl.files import replace_durably

LEASE_FILE = "policy_versions.lease"


class VersionLease:
    def __init__(self, run_dir: Path, at_least: int = 0, block: int = 100) -> None:
        """Versions handed out start above `at_least` and above anything reserved before."""
        self.path = Path(run_dir) / LEASE_FILE
        self.block = block
        self.reserved = self._read()
        self.last = max(at_least, self.reserved)  # the last version handed out (or possibly published)

    def _read(self) -> int:
        try:
            return int(self.path.read_text().strip() or 0)
        except FileNotFoundError:
            return 0
        except ValueError as exc:
            raise ValueError(
                f"{self.path} is not a version number ({exc}); delete it only if no edge "
                "or checkpoint of this run will ever be used again"
            ) from None

    def next(self) -> int:
        """A new version number, reserved on disk before it is returned."""
        version = self.last + 1
        if version > self.reserved:
            self._reserve(version + self.block - 1)
        self.last = version
        return version

    def _reserve(self, up_to: int) -> None:
        replace_durably(self.path, f"{up_to}\n")
        self.reserved = up_to

    def release(self) -> None:
        """After a clean stop: reserve only what was handed out, so the next start goes on from there."""
        if self.reserved > self.last:
            self._reserve(self.last)
