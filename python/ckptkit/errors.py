"""ckptkit's errors in Python.

Every failure of the Go core crosses the C ABI as its ckpterr class number
(the same classes that decide the CLI's exit codes), the resume rule it
broke (when it is one) and the message naming key, object and URL. They all
raise a subclass of :class:`CheckpointError`.
"""

from typing import Dict, Optional, Type

# ckpterr class numbers (ckpterr/ckpterr.go); stable across versions.
INTERNAL = 0
BAD_CHECKPOINT = 1
USAGE = 2
NOT_FOUND = 3
ACCESS = 4
TRANSIENT = 5
CONFLICT = 6
UNSUPPORTED = 7
CANCELED = 8

CLASS_NAMES: Dict[int, str] = {
    INTERNAL: "internal",
    BAD_CHECKPOINT: "bad-checkpoint",
    USAGE: "usage",
    NOT_FOUND: "not-found",
    ACCESS: "access",
    TRANSIENT: "transient",
    CONFLICT: "conflict",
    UNSUPPORTED: "unsupported",
    CANCELED: "canceled",
}


class CheckpointError(Exception):
    """Base of every ckptkit error. ``cls`` is the ckpterr class number,
    ``class_name`` its name, ``rule`` the resume rule broken (or None)."""

    default_cls = INTERNAL

    def __init__(self, message: str, cls: Optional[int] = None, rule: Optional[str] = None) -> None:
        super().__init__(message)
        self.message: str = message
        self.cls: int = self.default_cls if cls is None else cls
        self.rule: Optional[str] = rule

    @property
    def class_name(self) -> str:
        """The class as named in the CLI's JSON output."""
        return CLASS_NAMES.get(self.cls, "internal")


class BadCheckpointError(CheckpointError):
    """The checkpoint is corrupt, incomplete, or does not match the target."""

    default_cls = BAD_CHECKPOINT


class PartialStateError(BadCheckpointError):
    """Resume rule 2: some optimizer slots of a parameter are saved and others
    are missing; raised before any tensor of the model or optimizer changed."""


class LayoutMismatchError(BadCheckpointError):
    """Resume rule 3: optimizer state was saved but none of it belongs to a
    parameter of the target (renamed prefix, other flattening)."""


class CoverageError(BadCheckpointError):
    """Resume rule 4: a tensor's saved chunks do not tile its global shape."""


class ChecksumError(BadCheckpointError):
    """Resume rule 7: stored bytes do not match their CRC32C."""


class IncompleteError(BadCheckpointError):
    """The prefix holds data but no committed metadata."""


class MissingKeysError(BadCheckpointError):
    """Keys the target needs are not in the checkpoint (rule 5)."""


class MismatchError(BadCheckpointError):
    """A key's kind, dtype or shape differs between checkpoint and target."""


class UsageError(CheckpointError):
    """Invalid arguments, options, keys or URLs."""

    default_cls = USAGE


class NotFoundError(CheckpointError):
    """The object, path or checkpoint does not exist."""

    default_cls = NOT_FOUND


class AccessError(CheckpointError):
    """The storage does not allow it: the credentials, file permissions, or
    a file system that is read-only, full or over quota (the message names
    the path and says what to do)."""

    default_cls = ACCESS


class TransientError(CheckpointError):
    """A storage failure that may succeed later."""

    default_cls = TRANSIENT


class ConflictError(CheckpointError):
    """Something already exists (a committed checkpoint, a create-if-absent write)."""

    default_cls = CONFLICT


class UnsupportedError(CheckpointError):
    """The backend, format or dtype cannot do it."""

    default_cls = UNSUPPORTED


class CanceledError(CheckpointError):
    """The operation was cancelled."""

    default_cls = CANCELED


# The rule names are the Go core's (loader.Rules, listed in
# loader/testdata/rules.txt; python/tests/test_errors.py keeps them equal).
_BY_RULE: Dict[str, Type[CheckpointError]] = {
    "partial-optimizer-state": PartialStateError,
    "layout-mismatch": LayoutMismatchError,
    "shard-coverage": CoverageError,
    "checksum": ChecksumError,
    "uncommitted": IncompleteError,
    "missing-keys": MissingKeysError,
    "mismatch": MismatchError,
    "missing-object": BadCheckpointError,
}

_BY_CLASS: Dict[int, Type[CheckpointError]] = {
    BAD_CHECKPOINT: BadCheckpointError,
    USAGE: UsageError,
    NOT_FOUND: NotFoundError,
    ACCESS: AccessError,
    TRANSIENT: TransientError,
    CONFLICT: ConflictError,
    UNSUPPORTED: UnsupportedError,
    CANCELED: CanceledError,
}


def from_abi(cls: int, rule: str, message: str) -> CheckpointError:
    """The exception for an error that crossed the C ABI."""
    typ = _BY_RULE.get(rule) or _BY_CLASS.get(cls, CheckpointError)
    return typ(message, cls=cls, rule=rule or None)
