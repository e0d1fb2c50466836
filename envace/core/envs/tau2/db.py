"""Cheap resets of tau2's databases: a used database is put back to the pristine one in place.

tau2 loads a domain's database from disk (airline's is 7 MB of JSON: ~0.3 s to load and
validate), and a deep copy of the loaded pydantic model costs as much. A task changes a handful
of records, so :class:`Restorer` dumps the used database (``model_dump``, ~30 ms), compares each
top-level collection with the pristine dump, and re-validates only the records that differ (a
dict of records: per key; anything else: the whole field). It then checks that the fields it put
back dump as the pristine ones, and makes a deep copy where they do not (a safety net).

    r = restorer("airline")
    db = r.fresh()            # a deep copy (the first time)
    ...                       # tau2's tools change db in place
    db = r.restore(db)        # the same object, pristine again
"""

from __future__ import annotations

import copy
import threading
import typing
from typing import Any

from pydantic import BaseModel, TypeAdapter


class Restorer:
    """Puts databases of one pydantic DB class back to one pristine instance."""

    def __init__(self, pristine: BaseModel) -> None:
        self.pristine = pristine
        self.cls = type(pristine)
        self.dump = pristine.model_dump()
        self._records: dict[str, type[BaseModel] | None] = {}
        self._adapters: dict[str, TypeAdapter] = {}
        self.restored = 0
        self.copied = 0
        for name, info in self.cls.model_fields.items():
            ann = info.annotation
            args = typing.get_args(ann)
            if (typing.get_origin(ann) is dict and len(args) == 2 and isinstance(args[1], type)
                    and issubclass(args[1], BaseModel)):
                self._records[name] = args[1]
            self._adapters[name] = TypeAdapter(ann)

    def fresh(self) -> BaseModel:
        """A deep copy of the pristine database."""
        self.copied += 1
        return self.pristine.model_copy(deep=True)

    def restore(self, db: BaseModel) -> BaseModel:
        """``db`` (changed in place by tools) made pristine again; a fresh copy where ``db`` is
        not of this class or could not be put back."""
        if type(db) is not self.cls:
            return self.fresh()
        now = db.model_dump()
        changed = set()
        for name, want in self.dump.items():
            have = now.get(name)
            if have == want:
                continue
            changed.add(name)
            record = self._records.get(name)
            current = getattr(db, name)
            if record is not None and isinstance(current, dict) and isinstance(have, dict):
                for key in [k for k in current if k not in want]:
                    del current[key]
                for key, value in want.items():
                    if have.get(key) != value:
                        current[key] = record.model_validate(copy.deepcopy(value))
            else:
                setattr(db, name, self._adapters[name].validate_python(copy.deepcopy(want)))
        if set(db.__dict__) != set(self.pristine.__dict__) or (changed and db.model_dump(
                include=changed) != {k: self.dump[k] for k in changed}):
            return self.fresh()
        self.restored += 1
        return db


_RESTORERS: dict[Any, Restorer] = {}
_LOCK = threading.Lock()


def restorer(key: Any, pristine: BaseModel) -> Restorer:
    """The restorer of a pristine database, one per ``key`` (domain and database), cached."""
    with _LOCK:
        if key not in _RESTORERS:
            _RESTORERS[key] = Restorer(pristine)
        return _RESTORERS[key]


class Slots:
    """Per-thread spare databases of the verifier: tau2's evaluator builds two environments
    per check (the episode replayed, the gold actions); their databases are reused, restored,
    by the next check in the same thread."""

    def __init__(self) -> None:
        self._local = threading.local()

    def take(self, key: Any, r: Restorer, slot: int) -> BaseModel:
        spares: dict[Any, BaseModel] = self._local.__dict__.setdefault("spares", {})
        db = spares.get((key, slot))
        db = r.fresh() if db is None else r.restore(db)
        spares[(key, slot)] = db
        return db
