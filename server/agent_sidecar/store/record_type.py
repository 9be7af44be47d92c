"""``@record``: the shape of every value that crosses the storage seam.

A record is a frozen, slotted dataclass that pickles as its class and the
tuple of its fields, because records cross the store writer's pipe several
times a turn and dataclasses' own pickling and ``__init__`` do per-field work
in Python on both ends.
"""

from __future__ import annotations

import operator
from dataclasses import MISSING, dataclass, fields
from typing import Any, TypeVar, dataclass_transform

T = TypeVar("T")


@dataclass_transform(frozen_default=True)
def record(cls: type[T]) -> type[T]:
    """``cls`` as a frozen, slotted dataclass that pickles as its class and
    the tuple of its field values (unpickling calls ``__init__`` with them).

    dataclasses' own pickling of a frozen slotted class runs ``fields()`` and
    a ``setattr`` per field in Python on both ends; these values cross the
    writer pipe several times a turn. Every field must be a positional
    ``__init__`` parameter and there is no ``__post_init__``, so the copy is
    the value."""
    made: Any = dataclass(frozen=True, slots=True)(cls)
    fs = fields(made)
    assert all(f.init and not f.kw_only for f in fs) and not hasattr(made, "__post_init__"), made
    made.__init__ = _slot_init(made, fs)
    return pickled_as_fields(made, fs)


def pickled_as_fields(cls: Any, fs: tuple) -> Any:
    """``cls`` pickles as itself and the tuple of its field values, in
    ``__init__``'s order (unpickling calls it with them). Defined as
    ``__reduce_ex__``, the method pickle (and copy) call first: a
    ``__reduce__`` is reached through ``object.__reduce_ex__``, one more call
    per record pickled."""
    get = operator.attrgetter(*(f.name for f in fs))
    if len(fs) == 1:
        cls.__reduce_ex__ = lambda self, protocol: (cls, (get(self),))
    else:
        cls.__reduce_ex__ = lambda self, protocol: (cls, get(self))
    return cls


def _slot_init(cls: Any, fs: tuple) -> Any:
    """The ``__init__`` of a frozen slotted record: each field stored through
    its slot's descriptor, with the dataclass's own parameters and defaults.
    The dataclass's ``__init__`` stores each through ``object.__setattr__``
    (a lookup and a call per field), which made building a record several
    times dearer than a tuple; records are built and unpickled several times
    a turn. The instance is as frozen as before: ``__setattr__`` still refuses."""
    ns: dict[str, Any] = {"_MISSING": MISSING}
    params, body = [], []
    for f in fs:
        ns[f"_set_{f.name}"] = cls.__dict__[f.name].__set__
        if f.default is not MISSING:
            ns[f"_d_{f.name}"] = f.default
            params.append(f"{f.name}=_d_{f.name}")
        elif f.default_factory is not MISSING:
            ns[f"_f_{f.name}"] = f.default_factory
            params.append(f"{f.name}=_MISSING")
            body.append(f"    if {f.name} is _MISSING:\n        {f.name} = _f_{f.name}()")
        else:
            params.append(f.name)
        body.append(f"    _set_{f.name}(self, {f.name})")
    exec(f"def __init__(self, {', '.join(params)}):\n" + ("\n".join(body) or "    pass"), ns)  # noqa: S102
    init = ns["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    return init
