"""Which values ``%distribute pull`` and ``push`` may copy between processes: plain data, never
TensorFlow or Keras objects.

ipyparallel pickles a pulled value on the one engine it is pulled from. Pickling a Keras model
(a History holds one) saves it, reading every variable; under MultiWorkerMirroredStrategy reading
a distributed variable can be a collective (a metric's SyncOnReadVariable is all-reduced across
the workers), which only that worker joins: it waits for the others forever, and the cluster is
stalled. ``find_unsendable`` walks a value by type only, with no process state: the kernel runs
it on the values of ``push``, each worker on a value to be pulled (``inengine.transfer``).
``parse_name`` reads the names ``pull`` takes.
"""

from __future__ import annotations

import ast
import functools
import itertools
import sys
import types
from collections.abc import Iterator
from typing import Any

#: Top-level packages whose classes are TensorFlow's or Keras's (public modules and private).
FRAMEWORKS = ("tensorflow", "keras", "tf_keras")
#: Containers nested deeper than this are not looked into.
MAX_DEPTH = 8
#: Objects looked at per value at most: what lies beyond is not checked (a list of millions of
#: numbers stays fast to pull).
MAX_OBJECTS = 100_000

# How a type's instances are walked, decided once per type.
_LEAF, _PLAIN_TF, _DICT, _SEQ, _SET, _OBJARRAY, _FUNC, _METHOD, _PARTIAL, _INSTANCE = range(10)
_FRAMEWORK = -1
_LEAVES = (int, float, complex, bool, str, bytes, bytearray, type(None), range, slice, type,
           types.ModuleType, types.BuiltinFunctionType)
_MISSING = object()


def framework_of(cls: type) -> str | None:
    """``tensorflow``, ``keras`` or ``tf_keras`` for a class of theirs or a subclass of one
    (the first such class in its MRO), else None."""
    for c in cls.__mro__:
        module = getattr(c, "__module__", None)
        if isinstance(module, str) and module.split(".")[0] in FRAMEWORKS:
            return module.split(".")[0]
    return None


def _public(module: Any, dotted: str) -> type | None:
    """``module.a.b`` when it is a class (public names only; None where this version lacks it)."""
    found = module
    for part in dotted.split("."):
        found = getattr(found, part, None)
        if found is None:
            return None
    return found if isinstance(found, type) else None


def _kinds() -> list[tuple[str, type]]:
    """(kind, public class) for the kinds the refusal names, most specific first. Only
    libraries already imported are asked: a value of a library not imported cannot exist."""
    kinds: list[tuple[str, Any, str]] = []
    for name in ("tf_keras", "keras"):   # the workers' tf.keras, and Keras 3
        keras = sys.modules.get(name)
        if keras is not None:
            kinds += [("history", keras, "callbacks.History"), ("model", keras, "Model"),
                      ("metric", keras, "metrics.Metric"), ("layer", keras, "layers.Layer"),
                      ("optimizer", keras, "optimizers.Optimizer"),
                      ("optimizer", keras, "optimizers.legacy.Optimizer"),
                      ("callback", keras, "callbacks.Callback"), ("variable", keras, "Variable")]
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        kinds += [("variable", tf, "Variable"),
                  ("distributed", tf, "distribute.DistributedValues"),
                  ("strategy", tf, "distribute.Strategy"),
                  ("dataset", tf, "data.Dataset"), ("dataset", tf, "distribute.DistributedDataset"),
                  ("iterator", tf, "data.Iterator"),
                  ("iterator", tf, "distribute.DistributedIterator"),
                  ("function", tf, "types.experimental.GenericFunction"),
                  ("function", tf, "types.experimental.ConcreteFunction")]
    return [(kind, cls) for kind, module, dotted in kinds
            if (cls := _public(module, dotted)) is not None]


def _plain_tf(cls: type) -> bool:
    """TensorFlow types that are plain data: a tensor (eager: its values are local, pickled as
    NumPy; a graph tensor fails to pickle by itself), a shape, a dtype, a TensorSpec. Variables
    and distributed values are not (their reads can be collectives)."""
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return False
    data = tuple(c for c in (_public(tf, "TensorShape"), _public(tf, "dtypes.DType"),
                             _public(tf, "TensorSpec")) if c is not None)
    if data and issubclass(cls, data):
        return True
    tensor = _public(tf, "Tensor")
    state = tuple(c for c in (_public(tf, "Variable"),
                              _public(tf, "distribute.DistributedValues")) if c is not None)
    return tensor is not None and issubclass(cls, tensor) and not issubclass(cls, state)


def _shape(cls: type) -> int:
    """How instances of ``cls`` are walked (by their type alone)."""
    if issubclass(cls, _LEAVES):
        return _LEAF
    if framework_of(cls) is not None:
        return _PLAIN_TF if _plain_tf(cls) else _FRAMEWORK
    if issubclass(cls, dict):
        return _DICT
    if issubclass(cls, (list, tuple)):
        return _SEQ
    if issubclass(cls, (set, frozenset)):
        return _SET
    numpy = sys.modules.get("numpy")
    if numpy is not None and issubclass(cls, numpy.ndarray):
        return _OBJARRAY
    if issubclass(cls, types.FunctionType):
        return _FUNC
    if issubclass(cls, types.MethodType):
        return _METHOD
    if issubclass(cls, functools.partial):
        return _PARTIAL
    return _INSTANCE if cls.__dictoffset__ or _slots(cls) else _LEAF


@functools.lru_cache(maxsize=256)
def _slots(cls: type) -> tuple[Any, ...]:
    """The member descriptors of ``cls``'s ``__slots__`` (and its bases')."""
    return tuple(member for c in cls.__mro__ for member in vars(c).values()
                 if isinstance(member, types.MemberDescriptorType))


def _children(obj: Any, shape: int) -> Iterator[tuple[Any, tuple[str, Any]]]:
    """(child, (how it is reached, key)) of ``obj``, read through the builtin types' own
    methods, never a subclass's overrides (no user code and no TensorFlow code runs)."""
    if shape == _DICT:
        for key, value in dict.items(obj):
            yield key, ("key", None)
            yield value, ("item", key)
    elif shape == _SEQ:
        base = list if issubclass(type(obj), list) else tuple
        for i, value in enumerate(base.__iter__(obj)):
            yield value, ("item", i)
    elif shape == _SET:
        base = set if issubclass(type(obj), set) else frozenset
        for value in base.__iter__(obj):
            yield value, ("element", None)
    elif shape == _OBJARRAY:
        if obj.dtype.hasobject:   # NumPy arrays of Python objects, rare
            for value in obj.flat:
                yield value, ("element", None)
    elif shape == _FUNC:   # ipyparallel sends a function's defaults and closure with it
        for value in (*(obj.__defaults__ or ()), *(obj.__kwdefaults__ or {}).values()):
            yield value, ("default", None)
        for cell in (obj.__closure__ or ()):
            try:
                yield cell.cell_contents, ("closure", None)
            except ValueError:   # a cell not filled yet
                continue
    elif shape == _METHOD:   # pickled with the object it is bound to
        yield obj.__self__, ("self", None)
        yield obj.__func__, ("attr", "__func__")
    elif shape == _PARTIAL:
        yield obj.func, ("attr", "func")
        for value in (*obj.args, *obj.keywords.values()):
            yield value, ("argument", None)
    elif shape == _INSTANCE:   # an object of the user's: pickled with its __dict__ or slots
        try:
            own = object.__getattribute__(obj, "__dict__")
        except AttributeError:
            own = None
        if type(own) is dict:
            for key, value in own.items():
                yield value, ("attr", key)
        for member in _slots(type(obj)):
            try:
                yield member.__get__(obj, type(obj)), ("attr", member.__name__)
            except AttributeError:   # a slot not set
                continue


_PATHS = {"item": "{}[{!r}]", "attr": "{}.{}", "key": "a key of {}",
          "element": "an element of {}", "default": "a default of {}",
          "closure": "a variable {} closes over", "self": "the object {} is bound to",
          "argument": "an argument of {}"}


def _path(node: Any) -> str:
    """``results['model']``, from the chain of steps ``find_unsendable`` followed."""
    if isinstance(node, str):
        return node
    parent, (how, key) = node
    return _PATHS[how].format(_path(parent), key)


#: Types never looked into, skipped before they are queued (exact types: fast).
_EXACT_LEAVES = frozenset({int, float, complex, bool, str, bytes, type(None)})


def find_unsendable(value: Any, where: str) -> dict[str, str] | None:
    """The first TensorFlow or Keras object in ``value`` that is not plain data, as
    ``{"path", "kind", "type"}`` (``path``: where it is, starting from ``where``), or None.

    Walks dicts, lists, tuples, sets, NumPy object arrays, functions' defaults and closures and
    the ``__dict__`` of the user's own objects, at most ``MAX_DEPTH`` deep and ``MAX_OBJECTS``
    objects; looks at types only (no attribute of a TensorFlow object is read)."""
    shapes: dict[type, int] = {}
    kinds: list[tuple[str, type]] | None = None
    seen: set[int] = set()
    todo: list[tuple[Any, Any, int]] = [(value, where, 0)]
    budget = MAX_OBJECTS
    while todo:
        obj, path, depth = todo.pop()
        cls = type(obj)
        shape = shapes.get(cls)
        if shape is None:
            shape = shapes[cls] = _shape(cls)
        if shape in (_LEAF, _PLAIN_TF) or id(obj) in seen:
            continue
        seen.add(id(obj))
        if shape == _FRAMEWORK:
            kinds = _kinds() if kinds is None else kinds
            kind = next((k for k, c in kinds if issubclass(cls, c)), None)
            if kind is None:   # another of their classes: named by its library
                kind = "tensorflow" if framework_of(cls) == "tensorflow" else "keras"
            return {"path": _path(path), "kind": kind,
                    "type": f"{cls.__module__}.{cls.__qualname__}"}
        if depth < MAX_DEPTH and budget > 0:
            found = list(itertools.islice(_children(obj, shape), budget))
            budget -= len(found)
            todo.extend((child, (path, how), depth + 1) for child, how in reversed(found)
                        if type(child) not in _EXACT_LEAVES)
    return None


def parse_name(name: str) -> list[tuple[str, Any]]:
    """``[("name", root), ("attr", a), ("item", key), ...]`` for ``root.a[key]...``; keys are
    Python literals. ValueError for anything else (a call, an operator, a slice)."""
    try:
        node = ast.parse(name.strip(), mode="eval").body
    except SyntaxError:
        raise ValueError(name) from None
    steps: list[tuple[str, Any]] = []
    while not isinstance(node, ast.Name):
        if isinstance(node, ast.Attribute):
            steps.append(("attr", node.attr))
            node = node.value
        elif isinstance(node, ast.Subscript):
            try:
                steps.append(("item", ast.literal_eval(node.slice)))
            except (ValueError, TypeError, SyntaxError):
                raise ValueError(name) from None
            node = node.value
        else:
            raise ValueError(name)
    steps.append(("name", node.id))
    return steps[::-1]
