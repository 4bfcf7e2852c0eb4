"""What every section of the run config shares: the frozen base, the bounds, the problem lists.

    raise_all(problems_of("cluster.zone", accelerators.check_zone, acc, zone))
    check_scheme("s3://bucket/x", "read")   # ValueError: tpuctl reads local paths and gs:// only
    section.problems()                       # what its @check methods find, every one

A section checks what is wrong between its keys in `@check` methods, each returning problem
lines: a valid section runs them all when it is validated; a section some of whose keys did not
parse is rebuilt as a partial one (`partial`, its bad keys standing as UNPARSED), and a check
that reads such a key is left out, so that the others still report in the same round.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from payload.core.engines import DEFAULT as DEFAULT_ENGINE
from payload.core.errors import UserError

MIN_SEQ_LEN = 16
# Local worker processes share this machine's cores; more than this is a typo.
MAX_LOCAL_WORKERS = 64
# Byte-level BPE starts from all 256 byte symbols before it learns any merge.
BYTE_ALPHABET = 256
# The smallest useful vocabulary for the other kinds, on top of the special tokens.
MIN_LEARNED_PIECES = 64
# Bounds past any real run: a value beyond them is a typo (1e30 steps would never end, and a
# learning rate over 1 sends AdamW and Adafactor to NaN within steps).
MAX_STEPS = 1_000_000_000
MAX_LEARNING_RATE = 1.0
# train.engine: payload.core.engines' names (a test holds this Literal to them).
EngineName = Literal["tensorflow", "jax"]


class Unparsed(Exception):
    """A check read a key whose value did not parse (UNPARSED): the check is left out."""


class _Unparsed:
    """The value of a key that did not parse, in a partial section: any use of it (comparing,
    testing, formatting, reading an attribute) raises Unparsed, which ends the check reading it."""

    def _refuse(self, *_args, **_kwargs):
        raise Unparsed

    __bool__ = __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _refuse
    __str__ = __format__ = __iter__ = __len__ = __contains__ = __getitem__ = _refuse
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = _refuse
    __mod__ = __rmod__ = __floordiv__ = __float__ = __int__ = __index__ = __hash__ = _refuse

    def __getattr__(self, name: str):
        if name.startswith("__"):  # copy, pickle and the like look for optional hooks
            raise AttributeError(name)
        raise Unparsed

    def __repr__(self) -> str:
        return "UNPARSED"

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


UNPARSED = _Unparsed()
# The validation context's key that asks for a partial section: its checks wait (`partial`).
_PARTIAL = "partial"


def check(method: Callable[[Any], list[str]]) -> Callable[[Any], list[str]]:
    """Mark a section's method as one of its checks: it returns the problems it finds."""
    method.is_check = True  # type: ignore[attr-defined]
    return method


# A user name as the workers' sshd and Compute Engine's ssh-keys metadata (USER:KEY, one a
# line) take it: the POSIX portable characters, not starting with a dash, at most 32 (Linux's
# useradd limit); nothing that ends a line, a field or an ssh option.
_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,31}\Z")


def _user_name(value: str) -> str:
    if not _USER.match(value):
        raise ValueError(f"{value!r} is not a user name: 1-32 letters, digits, '.', '_' and "
                         "'-', not starting with '-' (it becomes the workers' login and a line "
                         "of Compute Engine's ssh-keys)")
    return value


def _path_text(value: str) -> str:
    if "\n" in value or "\r" in value or "\0" in value:
        raise ValueError(f"{value!r} holds a line break or a NUL byte, which no path tpuctl "
                         "reads or hands to ssh may hold")
    return value


# cluster.user on every provider that logs in (ssh, gcp, gce).
UserName = Annotated[str, AfterValidator(_user_name)]
# A path or URL a key names (files, folders, gs://): one line of text, no NUL.
PathText = Annotated[str, AfterValidator(_path_text)]


class _NotANumber:
    """A true or false given where a number is wanted: no number type takes it, so the key's
    own validation refuses it as not a number, beside the section's other problems."""

    def __init__(self, value: bool):
        self.value = value

    def __repr__(self) -> str:
        return repr(self.value)


def _wants_a_number(annotation: Any) -> bool:
    kinds = set(get_args(annotation)) or {annotation}
    return bool not in kinds and bool(kinds & {int, float})


class Section(BaseModel):
    # Infinity and NaN are never a sensible setting (`learning_rate: .inf` would train to NaN).
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True,
                              allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _numbers_are_not_booleans(cls, raw: Any) -> Any:
        """YAML's true and false are never numbers, for every numeric key of every section
        (pydantic's lax mode would take `port: true` as port 1)."""
        if not isinstance(raw, dict):
            return raw
        return {key: _NotANumber(value) if isinstance(value, bool) and key in cls.model_fields
                and _wants_a_number(cls.model_fields[key].annotation) else value
                for key, value in raw.items()}

    @model_validator(mode="after")
    def _checked(self, info: ValidationInfo):
        context = info.context or {}
        self.take_context(context)
        if not context.get(_PARTIAL):
            raise_all(self.problems())
        return self

    def take_context(self, context: dict) -> None:
        """Keep what the section needs of the validation context (parse_config's)."""

    def problems(self) -> list[str]:
        """Every problem the section's checks find; a check that reads a key which did not
        parse (a partial section's) is left out."""
        return run_checks([getattr(self, name) for name in _checks_of(type(self))],
                          partial=self.is_partial)

    @property
    def is_partial(self) -> bool:
        """Whether some key of the section did not parse (it stands as UNPARSED)."""
        return any(value is UNPARSED for value in self.__dict__.values())


def run_checks(checks, *args, partial: bool) -> list[str]:
    """Every problem the checks find. On partial sections a check stops where it reads a key
    that did not parse: with Unparsed, or however a function that takes the value without
    calling its methods fails (re.match's TypeError). Those problems come on top of the ones
    already found, so a check that cannot run there is left out; on a whole section every
    error is a bug and shows as one."""
    found: list[str] = []
    for one in checks:
        try:
            found += one(*args)
        except Unparsed:
            pass
        except Exception:
            if not partial:
                raise
    return found


def _checks_of(kind: type) -> list[str]:
    """The names of a section class's checks, base classes' first, each in written order."""
    names: list[str] = []
    for klass in reversed(kind.__mro__):
        names += [n for n, v in vars(klass).items()
                  if getattr(v, "is_check", False) and n not in names]
    return names


def partial(kind: type[Section], raw: dict, unparsed: set[str], context: dict) -> Section | None:
    """`kind` from `raw` with the keys in `unparsed` (and required keys it lacks) standing as
    UNPARSED and unknown keys left out, its checks not yet run (call .problems()); None where
    even that does not validate."""
    fields = {key: UNPARSED if key in unparsed else value for key, value in raw.items()
              if key in kind.model_fields}
    # A required key that is missing (reported as such) stands as UNPARSED too.
    fields.update({key: UNPARSED for key, info in kind.model_fields.items()
                   if key in unparsed or (key not in fields and info.is_required())})
    shadow = _shadow(kind)
    try:
        return shadow.model_validate(fields, context={**context, _PARTIAL: True})
    except ValidationError:
        return None


def _pass_unparsed(value: Any, handler):
    return value if value is UNPARSED else handler(value)


_SHADOWS: dict[type, type] = {}


def _shadow(kind: type[Section]) -> type[Section]:
    """`kind` whose keys take UNPARSED as it is: the subclass's wrap validator is the
    outermost, so none of kind's own validators sees it."""
    if kind not in _SHADOWS:
        _SHADOWS[kind] = create_model(
            kind.__name__, __base__=kind, __module__=kind.__module__,
            __validators__={"_unparsed": field_validator("*", mode="wrap")(_pass_unparsed)})
    return _SHADOWS[kind]


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def check_scheme(value: str, what: str, *, quote: bool = True) -> str:
    """Local paths and gs:// only: another scheme (s3://) would become a relative local folder."""
    if value.startswith("gs:") and not value.startswith("gs://"):
        # gs:/x (one slash) would otherwise be read as a local folder named gs:.
        raise ValueError(f"'{value}' is not a gs:// URL; write gs://BUCKET/PATH")
    match = _SCHEME.match(value)
    if match and match.group(1) != "gs":
        shown = f"'{value}' uses" if quote else "uses"
        raise ValueError(f"{shown} {match.group(1)}://, which tpuctl cannot {what}; use a "
                         "local path or gs://BUCKET/PATH")
    return value


def engine_of(context: dict) -> str:
    """The train.engine a section is validated for (parse_config's context); an engine that is
    not one is reported by the train section, and the default stands in for it here."""
    engine = context.get("engine")
    return engine if engine in get_args(EngineName) else DEFAULT_ENGINE


def problems_of(key: str, check, *args) -> list[str]:
    """Run an accelerator-table check: its one-line refusal, naming the key, or nothing."""
    try:
        check(*args)
    except UserError as exc:
        return [f"{key}: {exc}"]
    return []


class Problems(ValueError):
    """Several problems a validator found at once: parse_config shows each as a line of its
    own. Any other error is one problem, whatever its text holds (a value may end in a
    newline)."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = list(problems)


def raise_all(problems: list[str]) -> None:
    if problems:
        raise Problems(problems)
