"""Name → component registries and strict construction from config mappings.

Every pluggable component (dataset source, partitioner, model, algorithm) is a pydantic model whose
fields are its options; it is registered under a name and built from a mapping such as
``{"name": "labels", "labels_per_client": 5}``. Validation failures become a one-line
:class:`~fedhp.errors.ConfigError` naming the field and what is allowed.
"""

from __future__ import annotations

import sys
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Generic, Literal, TypeVar

import pydantic

from fedhp.errors import ConfigError

T = TypeVar("T", bound=pydantic.BaseModel)


def format_validation_error(err: pydantic.ValidationError, prefix: str) -> str:
    """Render the first pydantic error as ``prefix.field: message (got value)``."""
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first.get("loc", ()))
    field = f"{prefix}.{loc}" if prefix and loc else (prefix or loc)
    msg = first.get("msg", "invalid value")
    if first.get("type") == "extra_forbidden":
        msg = "unknown key (remove it or check the spelling; `fedhp list` shows the options)"
    got = first.get("input")
    shown = "" if first.get("type") in ("extra_forbidden", "missing") else f" (got {got!r})"
    if len(shown) > 80:
        shown = shown[:77] + "...)"
    return f"{field}: {msg}{shown}"


INT_LIMIT = 2**63
"""Integers must fit int64 (what tensors and indices hold); larger ones are typos."""


def check_int_range(value: Any, prefix: str) -> None:
    """A one-line :class:`ConfigError` for an integer anywhere in ``value`` (nested mappings and
    lists) outside the int64 range, naming its dotted key."""
    if isinstance(value, Mapping):
        for key, sub in value.items():
            check_int_range(sub, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(value, list | tuple):
        for sub in value:
            check_int_range(sub, prefix)
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) >= INT_LIMIT:
        raise ConfigError(
            f"{prefix}: {value} is out of range (integers must lie within ±2**63); "
            "give a smaller value"
        )


def _takes_bool(annotation: Any) -> bool:
    """Whether a field of this type accepts true/false as such (bool, Any, a Literal or union
    naming them), rather than reading them as the numbers 1/0 as pydantic does for int/float."""
    if annotation is bool or annotation is Any:
        return True
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is Literal:
        return any(isinstance(a, bool) for a in args)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_takes_bool(a) for a in args)
    if typing.get_origin(annotation) is typing.Annotated:
        return _takes_bool(args[0])
    # int, float, str, containers, models: true/false is not what they mean
    return not (isinstance(annotation, type) or typing.get_origin(annotation) is not None)


def check_no_bools(cls: type[pydantic.BaseModel], data: Mapping[str, Any], prefix: str) -> None:
    """A one-line :class:`ConfigError` for true/false given to a field that is not a bool
    (``rounds=true`` would otherwise run 1 round), in ``data`` and its nested sections."""
    for key, value in data.items():
        field = cls.model_fields.get(key) if isinstance(key, str) else None
        if field is None:
            continue
        dotted = f"{prefix}.{key}" if prefix else str(key)
        annotation = field.annotation
        if isinstance(value, bool) and not _takes_bool(annotation):
            name = getattr(annotation, "__name__", None)
            kind = {"int": "an integer", "float": "a number", "str": "a string"}.get(
                str(name), "a value of its type"
            )
            example = field.default
            plain = isinstance(example, int | float | str) and not isinstance(example, bool)
            raise ConfigError(
                f"{dotted}: {str(value).lower()} is not {kind} (true/false are not numbers); "
                f"give {kind}" + (f", e.g. {dotted}={example}" if plain else "")
            )
        if (
            isinstance(value, Mapping)
            and isinstance(annotation, type)
            and issubclass(annotation, pydantic.BaseModel)
        ):
            check_no_bools(annotation, value, dotted)


def validate(cls: type[T], data: Mapping[str, Any], prefix: str) -> T:
    """Build ``cls`` from ``data`` or raise a one-line :class:`ConfigError`."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix}: expected a mapping of options, got {data!r}")
    if isinstance(cls, type) and issubclass(cls, pydantic.BaseModel):
        check_no_bools(cls, data, prefix)
    try:
        options = cls.model_validate(dict(data))
    except pydantic.ValidationError as err:
        raise ConfigError(format_validation_error(err, prefix)) from None
    check_int_range(options.model_dump(), prefix)
    return options


class Registry(Generic[T]):
    """A registry of components of one kind (e.g. ``"algorithm"``)."""

    every: list[Registry[Any]] = []
    """All registries (plugins that are re-imported drop their earlier registrations)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, type[T]] = {}
        Registry.every.append(self)

    def register(self, name: str) -> Callable[[type[T]], type[T]]:
        """Class decorator registering a component under ``name``."""

        def deco(cls: type[T]) -> type[T]:
            if name in self._items:
                taken = self._items[name]
                module = sys.modules.get(taken.__module__)
                where = getattr(module, "__file__", None) or taken.__module__
                raise ConfigError(
                    f"{self.kind} {name!r} is already registered (by {taken.__qualname__} in "
                    f"{where}); register yours under another name"
                )
            self._items[name] = cls
            return cls

        return deco

    def forget_module(self, module: str) -> None:
        """Drop the components registered by classes of ``module``."""
        for name in [n for n, cls in self._items.items() if cls.__module__ == module]:
            del self._items[name]

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.names())})"

    def get(self, name: object, field: str | None = None) -> type[T]:
        """The component registered as ``name``, or a one-line :class:`ConfigError`."""
        if not isinstance(name, str) or name not in self._items:
            where = field or f"{self.kind}.name"
            raise ConfigError(
                f"{where}: unknown {self.kind} {name!r}; choose one of: {', '.join(self.names())}"
            )
        return self._items[name]

    def build(self, cfg: Mapping[str, Any], prefix: str) -> T:
        """Construct the component named by ``cfg['name']`` with the remaining options."""
        if not isinstance(cfg, Mapping):
            raise ConfigError(f"{prefix}: expected a mapping with a 'name' key, got {cfg!r}")
        options = dict(cfg)
        name = options.pop("name", None)
        if name is None:
            raise ConfigError(f"{prefix}.name: missing; choose one of: {', '.join(self.names())}")
        cls = self.get(name, f"{prefix}.name")
        return validate(cls, options, prefix)
