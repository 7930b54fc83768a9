"""A griffe extension: the docstrings' Sphinx roles as mkdocstrings cross-references.

The package's docstrings use Sphinx roles (``:func:`.kernels.observe_update```,
``:class:`~envsched_jax.sched.config.EnvSchedConfig```). Once the whole package is loaded
(``on_package``), every role is rewritten:

* a target inside ``envsched_jax`` that names a documented (public) object becomes an autorefs
  link ``[`text`][full.path]``. Targets resolve as in Sphinx: an absolute dotted path, else a
  leading-dot suffix (``.kernels.observe_update``), else a name relative to the current module or
  class and its parents; among several suffix matches the one sharing the longest prefix with the
  current object wins;
* a target outside the package (``jax.jit``, ``numpy.quantile``) or a private one (a component
  starting with ``_``, not in the API reference) becomes inline code;
* a target that looks like the package's but resolves to nothing is an error: the build fails
  naming the object and the role (a broken reference, not something to render silently).

``~`` shows only the last component, as in Sphinx.
"""

from __future__ import annotations

import builtins
import logging
import re
import sys

import griffe

LOG = logging.getLogger("mkdocs.plugins.envsched_docs")
ROLE = re.compile(r":(?:py:)?(func|class|mod|meth|attr|data|obj|exc|const|type):`(~?)([^`<>]+?)`")
PACKAGE = "envsched_jax"


class UnresolvedReference(ValueError):
    pass


def _walk(obj, out: dict):
    out[obj.path] = obj
    for member in obj.members.values():
        if member.is_alias:
            out.setdefault(member.path, member)
            continue
        _walk(member, out)


# Pool data shipped inside the package: not in the API reference (docs/_build/gen_pages.py).
_NOT_DOCUMENTED = ("envsched_jax.pool.embedded.envs", "envsched_jax.pool.embedded.tasks")


def _is_public(path: str) -> bool:
    """Whether ``path`` has a page or an anchor in the API reference."""
    if any(path == d or path.startswith(d + ".") for d in _NOT_DOCUMENTED):
        return False
    return not any(part.startswith("_") for part in path.split(".")[1:])


class SphinxRoles(griffe.Extension):
    def __init__(self, package: str = PACKAGE) -> None:
        super().__init__()
        self.package = package

    def on_package(self, *, pkg, loader, **kwargs) -> None:
        if pkg.path != self.package:
            return
        objects: dict = {}
        _walk(pkg, objects)
        self._objects = objects
        errors = []
        for path, obj in objects.items():
            if obj.is_alias or obj.docstring is None:
                continue
            value = obj.docstring.value
            if ":`" not in value:
                continue
            obj.docstring.value = ROLE.sub(lambda m: self._rewrite(m, obj, errors), value)
        if errors:
            raise UnresolvedReference("unresolved cross-references in docstrings:\n  " + "\n  ".join(errors))

    def _candidates(self, target: str, obj, kind: str) -> list[str]:
        objects = {p: o for p, o in self._objects.items() if _kind_matches(o, kind)}
        if target.startswith(self.package + ".") or target == self.package:
            return [target] if target in objects else []
        if target.startswith("."):
            suffix = target.lstrip(".")
            scope = obj if obj.is_module else obj.parent
            while scope is not None:
                full = f"{scope.path}.{suffix}"
                if full in objects:
                    return [full]
                scope = scope.parent
        else:
            scope = obj if obj.is_module or obj.is_class else obj.parent
            while scope is not None:
                full = f"{scope.path}.{target}"
                if full in objects:
                    return [full]
                scope = scope.parent
            suffix = target
        matches = [p for p in objects if p == suffix or p.endswith("." + suffix)]
        if len(matches) > 1:
            def shared(p):
                a, b = p.split("."), obj.path.split(".")
                n = 0
                while n < min(len(a), len(b)) and a[n] == b[n]:
                    n += 1
                return n
            best = max(shared(p) for p in matches)
            matches = [p for p in matches if shared(p) == best]
            # a definition beats the aliases of it
            defs = [p for p in matches if not objects[p].is_alias]
            matches = defs or matches
        return matches

    def _rewrite(self, match: re.Match, obj, errors: list) -> str:
        kind, tilde, target = match.group(1), match.group(2), match.group(3).strip()
        target = target.rstrip("()")
        text = target.split(".")[-1] if tilde else target.lstrip(".")
        if kind in ("func", "meth"):
            text += "()"
        looks_internal = target.startswith(".") or target.startswith(self.package) or "." not in target
        candidates = self._candidates(target, obj, kind)
        if len(candidates) >= 1:
            path = candidates[0]
            if len(candidates) > 1:
                errors.append(f"{obj.path}: {match.group(0)} is ambiguous: {', '.join(candidates)}")
            if _is_public(path):
                return f"[`{text}`][{path}]"
            return f"`{text}`"
        if looks_internal and not _is_external(target):
            errors.append(f"{obj.path}: {match.group(0)} names nothing in {self.package}")
        return f"`{text}`"


_KINDS = {"mod": ("module",), "class": ("class",), "exc": ("class",), "func": ("function",),
          "meth": ("function",), "attr": ("attribute",), "data": ("attribute",), "const": ("attribute",),
          "type": ("class", "attribute", "type alias")}


def _kind_matches(obj, role: str) -> bool:
    kinds = _KINDS.get(role)
    if kinds is None:
        return True
    try:
        kind = obj.kind.value
    except Exception:  # an alias whose target is outside the loaded package
        return True
    return kind in kinds


_EXTERNAL = ("jax", "jnp", "numpy", "np", "scipy", "optax", "flax", "nnx", "orbax", "transformers", "torch",
             "vllm", "docker", "tyro", "sklearn", "ray", "trl", "verl", "tunix", "verifiers", "pyscipopt",
             "json", "os", "subprocess", "collections", "dataclasses", "typing", "pathlib", "logging",
             "re", "functools", "concurrent", "threading", "multiprocessing", "asyncio", "tempfile", "shutil",
             "math", "random", "io", "socket", "signal", "selectors", "hashlib", "contextlib", "itertools",
             "gguf", "safetensors", "datasets", "openai", "httpx", "requests", "PIL", "matplotlib", "rich")


def _is_external(target: str) -> bool:
    head = target.split(".")[0]
    return head in _EXTERNAL or head in sys.stdlib_module_names or hasattr(builtins, head)
