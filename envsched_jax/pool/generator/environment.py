"""Environment specs and their rendering: class source, tool schemas, rules, state space.

An :class:`EnvSpec` is the structured description of one synthetic environment (domain words,
enabled operation families, naming style, rule variants). Everything an :class:`Environment`
record holds is rendered from it, and each tool's method source and OpenAI schema come from the
same :class:`ToolDef`, so they cannot disagree. Task generation reads the same spec, which is how
reference actions stay consistent with the class without executing it.
"""

from __future__ import annotations

import dataclasses
import functools
import string
from typing import Any

from envsched_jax.pool.generator.domains import DOMAINS, REGIONS, Domain, human
from envsched_jax.pool.generator.stream import Stream
from envsched_jax.pool.model import Environment, Operation

# Operation families, in canonical order. gated_update and reassign are enabled everywhere: they
# are the state changes every task needs; the other seven are sampled per environment.
FAMILIES: tuple[str, ...] = ("lookup_by_name", "lookup_by_id", "list_filter", "gated_update",
                             "reassign", "create", "delete", "authorization", "aggregate")
CORE_FAMILIES = ("gated_update", "reassign")
OPTIONAL_FAMILIES = tuple(f for f in FAMILIES if f not in CORE_FAMILIES)

_GET_PREFIXES = ("get", "find", "lookup", "fetch")
_LIST_PREFIXES = ("list", "search", "browse")
_ASSIGN_FORMS = ("assign_{E}_to_{S}", "place_{E}_in_{S}", "allocate_{E}_to_{S}")
_SLOT_STATES = (("open", "closed"), ("available", "out_of_service"), ("active", "maintenance"))
_ID_STYLES = ("{P}-{{:04d}}", "{P}{{:05d}}", "{p}_{{:03d}}")
_LOG_NAMES = ("removal_log", "deletion_log", "audit_trail")


@dataclasses.dataclass(frozen=True)
class ToolDef:
    name: str
    family: str
    kind: str                                   # "query" | "state_change"
    description: str
    params: tuple[tuple[str, str, str], ...]    # (name, json type, description)
    body: str                                   # method body, already indented 8 spaces
    enums: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def schema(self) -> dict[str, Any]:
        enums = dict(self.enums)
        props: dict[str, Any] = {}
        for name, typ, desc in self.params:
            props[name] = {"type": typ, "description": desc}
            if name in enums:
                props[name]["enum"] = list(enums[name])
        return {"type": "function",
                "function": {"name": self.name, "description": self.description,
                             "parameters": {"type": "object", "properties": props,
                                            "required": [p[0] for p in self.params]}}}

    def source(self) -> str:
        annot = {"string": "str", "integer": "int"}
        args = "".join(f", {n}: {annot[t]}" for n, t, _ in self.params)
        return (f"    def {self.name}(self{args}) -> dict:\n"
                f"        \"\"\"{self.description}\"\"\"\n{self.body}")


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """One synthetic environment, before rendering."""

    seed: int
    index: int
    env_id: str
    class_name: str
    domain: Domain
    region: str
    families: tuple[str, ...]
    entity_attrs: tuple[tuple[str, Any], ...]
    slot_states: tuple[str, str]                # (open, shut)
    entity_id_format: str                       # str.format pattern for one integer
    slot_id_format: str
    actor_id_format: str
    log_name: str
    assign_requires_active: bool
    delete_requires_closed: bool
    delete_roles: tuple[str, ...]
    tool_names: dict[str, str]                  # role key -> tool name (only enabled ones)

    # ---- names of state tables and fields (cached: every record of every task shares them) ----
    @functools.cached_property
    def E(self) -> str:
        return self.domain.entity

    @functools.cached_property
    def Es(self) -> str:
        return self.domain.entity_plural

    @functools.cached_property
    def S(self) -> str:
        return self.domain.slot

    @functools.cached_property
    def Ss(self) -> str:
        return self.domain.slot_plural

    @functools.cached_property
    def As(self) -> str:
        return self.domain.actor_plural

    @functools.cached_property
    def E_id(self) -> str:
        return f"{self.domain.entity}_id"

    @functools.cached_property
    def S_id(self) -> str:
        return f"{self.domain.slot}_id"

    @functools.cached_property
    def A_id(self) -> str:
        return f"{self.domain.actor}_id"

    @functools.cached_property
    def CAT(self) -> str:
        return self.domain.category

    @functools.cached_property
    def next_name(self) -> str:
        return f"next_{self.domain.entity}_number"

    @functools.cached_property
    def pending(self) -> str:
        return self.domain.statuses[0]

    @functools.cached_property
    def active(self) -> str:
        return self.domain.statuses[1]

    @functools.cached_property
    def closed(self) -> str:
        return self.domain.statuses[2]

    @functools.cached_property
    def assignable(self) -> tuple[str, ...]:
        return (self.active,) if self.assign_requires_active else (self.pending, self.active)

    def has(self, family: str) -> bool:
        return family in self.families

    def tool(self, key: str) -> str:
        return self.tool_names[key]


def env_id_for(seed: int, index: int) -> str:
    return f"synth_s{seed}_env_{index:05d}"


def make_env_spec(seed: int, index: int, domain_order: list[int], st: Stream) -> EnvSpec:
    """Environment ``index``: its domain comes from the seed's domain order (so the first
    ``len(DOMAINS)`` environments all differ); everything else from its own stream ``st``."""
    domain = DOMAINS[domain_order[index % len(DOMAINS)]]
    cycle = index // len(DOMAINS)
    region = ""
    if cycle:
        region = REGIONS[(cycle - 1) % len(REGIONS)]
        if cycle > len(REGIONS):
            region += str((cycle - 1) // len(REGIONS) + 1)
    optional = list(OPTIONAL_FAMILIES)
    extra = st.sample(optional, st.between(3, len(optional)))
    if "authorization" in extra and "delete" not in extra:
        # A permission check is only meaningful next to the operation it guards.
        extra[extra.index("authorization")] = "delete"
    enabled = set(extra) | set(CORE_FAMILIES)
    families = tuple(f for f in FAMILIES if f in enabled)
    attrs = domain.entity_attrs
    keep = sorted(st.sample(range(len(attrs)), st.between(2, len(attrs))))
    entity_attrs = tuple(attrs[k] for k in keep)
    id_style = st.choice(_ID_STYLES)
    prefixes = _id_prefixes(domain)
    fmt = [id_style.format(P=p.upper(), p=p.lower()) for p in prefixes]
    get, lst = st.choice(_GET_PREFIXES), st.choice(_LIST_PREFIXES)
    E, Es, S, Ss = domain.entity, domain.entity_plural, domain.slot, domain.slot_plural
    names = {
        "lookup_name": f"{get}_{E}_by_name", "lookup_entity": f"{get}_{E}_by_id",
        "lookup_slot": f"{get}_{S}_by_id", "list_available": f"{lst}_available_{Ss}",
        "list_by_status": f"{lst}_{Es}_by_status", "activate": f"{domain.verbs[0]}_{E}",
        "close": f"{domain.verbs[1]}_{E}",
        "assign": st.choice(_ASSIGN_FORMS).format(E=E, S=S),
        "create": f"{domain.create_verb}_{E}", "delete": f"{domain.delete_verb}_{E}",
        "permission": f"check_{domain.actor}_permission",
        "count": f"count_{Es}_by_status", "summary": f"{get}_{S}_occupancy_summary",
    }
    per_family = {"lookup_by_name": ("lookup_name",), "lookup_by_id": ("lookup_entity", "lookup_slot"),
                  "list_filter": ("list_available", "list_by_status"),
                  "gated_update": ("activate", "close"), "reassign": ("assign",),
                  "create": ("create",), "delete": ("delete",), "authorization": ("permission",),
                  "aggregate": ("count", "summary")}
    tool_names = {k: names[k] for f in families for k in per_family[f]}
    title = "".join(w.capitalize() for w in domain.key.split("_"))
    return EnvSpec(
        seed=seed, index=index, env_id=env_id_for(seed, index),
        class_name=f"{title}{region}System", domain=domain, region=region, families=families,
        entity_attrs=entity_attrs, slot_states=st.choice(_SLOT_STATES),
        entity_id_format=fmt[0], slot_id_format=fmt[1], actor_id_format=fmt[2],
        log_name=st.choice(_LOG_NAMES), assign_requires_active=st.chance(0.5),
        delete_requires_closed=st.chance(0.4),
        delete_roles=domain.roles[2:] if st.chance(0.5) else domain.roles[1:],
        tool_names=tool_names)


def _id_prefixes(domain: Domain) -> tuple[str, str, str]:
    """Distinct two-to-three letter id prefixes for entities, slots and actors."""
    out: list[str] = []
    for word in (domain.entity, domain.slot, domain.actor):
        parts = word.split("_")
        cand = (parts[0][:2] + parts[1][0]) if len(parts) > 1 else word[:3]
        k = 3
        while cand in out:
            cand = word.replace("_", "")[:k + 1]
            k += 1
        out.append(cand)
    return tuple(out)  # type: ignore[return-value]


# ---- class source ----------------------------------------------------------------------------

_HEADER = string.Template('''\
class $CLASS:
    """$SUMMARY"""

    CATEGORIES = $CATEGORIES
    STATUSES = $STATUSES
    ASSIGNABLE_STATUSES = $ASSIGNABLE
    ID_FORMAT = $ID_FORMAT
    PERMISSIONS = $PERMISSIONS

    def __init__(self, init_config: dict = None):
        config = init_config if isinstance(init_config, dict) else {}
        self.$Es = dict(config.get("$Es", {}))
        self.$Ss = dict(config.get("$Ss", {}))
        self.$As = dict(config.get("$As", {}))
        self.$LOG = list(config.get("$LOG", []))
        self.$NEXT = int(config.get("$NEXT", 1))

    def _occupancy(self, slot_id):
        return sum(1 for r in self.$Es.values() if r.get("$S_id") == slot_id)

    def _find(self, entity_id):
        return self.$Es.get(entity_id) if isinstance(entity_id, str) else None

''')

_BODIES = {
    "lookup_name": '''\
        if not isinstance(name, str) or not name.strip():
            return {"success": False, "error": "name must be a non-empty string"}
        wanted = name.strip().lower()
        matches = [dict(r) for _, r in sorted(self.$Es.items())
                   if str(r.get("name", "")).lower() == wanted]
        if not matches:
            return {"success": False, "error": f"no $e named {name!r}"}
        return {"success": True, "data": matches}
''',
    "lookup_entity": '''\
        record = self._find($E_id)
        if record is None:
            return {"success": False, "error": f"unknown $e id {$E_id!r}"}
        return {"success": True, "data": dict(record)}
''',
    "lookup_slot": '''\
        slot = self.$Ss.get($S_id) if isinstance($S_id, str) else None
        if slot is None:
            return {"success": False, "error": f"unknown $s id {$S_id!r}"}
        data = dict(slot)
        data["occupancy"] = self._occupancy($S_id)
        return {"success": True, "data": data}
''',
    "list_available": '''\
        if $CAT not in self.CATEGORIES:
            return {"success": False,
                    "error": f"unknown $cat {$CAT!r}; expected one of {list(self.CATEGORIES)}"}
        rows = []
        for slot_id, slot in sorted(self.$Ss.items()):
            if slot.get("$CAT") != $CAT or slot.get("status") != $OPEN:
                continue
            free = slot.get("capacity", 0) - self._occupancy(slot_id)
            if free > 0:
                row = dict(slot)
                row["free"] = free
                rows.append(row)
        return {"success": True, "data": rows}
''',
    "list_by_status": '''\
        if status not in self.STATUSES:
            return {"success": False,
                    "error": f"unknown status {status!r}; expected one of {list(self.STATUSES)}"}
        rows = [dict(r) for _, r in sorted(self.$Es.items()) if r.get("status") == status]
        return {"success": True, "data": rows}
''',
    "activate": '''\
        record = self._find($E_id)
        if record is None:
            return {"success": False, "error": f"unknown $e id {$E_id!r}"}
        if record.get("status") != $PENDING:
            return {"success": False, "error": f"$e {$E_id} is {record.get('status')!r}; "
                                               f"only {$PENDING!r} $es can be changed to {$ACTIVE!r}"}
        record["status"] = $ACTIVE
        return {"success": True, "data": {"$E_id": $E_id, "status": $ACTIVE}}
''',
    "close": '''\
        record = self._find($E_id)
        if record is None:
            return {"success": False, "error": f"unknown $e id {$E_id!r}"}
        if record.get("status") != $ACTIVE:
            return {"success": False, "error": f"$e {$E_id} is {record.get('status')!r}; "
                                               f"only {$ACTIVE!r} $es can be changed to {$CLOSED!r}"}
        released = record.get("$S_id")
        record["status"] = $CLOSED
        record["$S_id"] = None
        return {"success": True, "data": {"$E_id": $E_id, "status": $CLOSED, "released_$S_id": released}}
''',
    "assign": '''\
        record = self._find($E_id)
        if record is None:
            return {"success": False, "error": f"unknown $e id {$E_id!r}"}
        slot = self.$Ss.get($S_id) if isinstance($S_id, str) else None
        if slot is None:
            return {"success": False, "error": f"unknown $s id {$S_id!r}"}
        if record.get("status") not in self.ASSIGNABLE_STATUSES:
            return {"success": False, "error": f"$e {$E_id} is {record.get('status')!r}; only "
                                               f"{list(self.ASSIGNABLE_STATUSES)} $es can be assigned"}
        if slot.get("status") != $OPEN:
            return {"success": False, "error": f"$s {$S_id} is {slot.get('status')!r}"}
        if slot.get("$CAT") != record.get("$CAT"):
            return {"success": False, "error": f"$e {$E_id} needs $cat {record.get('$CAT')!r} "
                                               f"but $s {$S_id} is {slot.get('$CAT')!r}"}
        if record.get("$S_id") == $S_id:
            return {"success": False, "error": f"$e {$E_id} is already assigned to {$S_id}"}
        if self._occupancy($S_id) >= slot.get("capacity", 0):
            return {"success": False, "error": f"$s {$S_id} is full"}
        previous = record.get("$S_id")
        record["$S_id"] = $S_id
        return {"success": True, "data": {"$E_id": $E_id, "$S_id": $S_id, "previous_$S_id": previous}}
''',
    "create_head": '''\
        if not isinstance(name, str) or not name.strip():
            return {"success": False, "error": "name must be a non-empty string"}
        if $CAT not in self.CATEGORIES:
            return {"success": False,
                    "error": f"unknown $cat {$CAT!r}; expected one of {list(self.CATEGORIES)}"}
''',
    "create_tail": '''\
        wanted = name.strip().lower()
        if any(str(r.get("name", "")).lower() == wanted for r in self.$Es.values()):
            return {"success": False, "error": f"a $e named {name!r} already exists"}
        new_id = self.ID_FORMAT.format(self.$NEXT)
        while new_id in self.$Es:
            self.$NEXT += 1
            new_id = self.ID_FORMAT.format(self.$NEXT)
        self.$NEXT += 1
        self.$Es[new_id] = {"$E_id": new_id, "name": name.strip(), "status": $PENDING,
                            "$CAT": $CAT, "$S_id": None, $ATTR_FIELDS}
        return {"success": True, "data": {"$E_id": new_id, "status": $PENDING}}
''',
    "delete": '''\
        actor = self.$As.get($A_id) if isinstance($A_id, str) else None
        if actor is None:
            return {"success": False, "error": f"unknown $a id {$A_id!r}"}
        if actor.get("role") not in self.PERMISSIONS["$T_DELETE"]:
            return {"success": False, "error": f"$a {$A_id} ({actor.get('role')}) is not "
                                               f"authorised to run $T_DELETE"}
        record = self._find($E_id)
        if record is None:
            return {"success": False, "error": f"unknown $e id {$E_id!r}"}
$DELETE_GATE\
        del self.$Es[$E_id]
        self.$LOG.append({"$E_id": $E_id, "name": record.get("name"), "removed_by": $A_id})
        return {"success": True, "data": {"$E_id": $E_id, "removed_by": $A_id}}
''',
    "permission": '''\
        actor = self.$As.get($A_id) if isinstance($A_id, str) else None
        if actor is None:
            return {"success": False, "error": f"unknown $a id {$A_id!r}"}
        if not isinstance(operation, str) or operation not in self.PERMISSIONS:
            return {"success": False, "error": f"unknown operation {operation!r}; permission-"
                                               f"controlled operations: {sorted(self.PERMISSIONS)}"}
        allowed = actor.get("role") in self.PERMISSIONS[operation]
        return {"success": True, "data": {"$A_id": $A_id, "role": actor.get("role"),
                                          "operation": operation, "allowed": allowed}}
''',
    "count": '''\
        counts = {status: 0 for status in self.STATUSES}
        for record in self.$Es.values():
            status = record.get("status")
            if isinstance(status, str) and status in counts:
                counts[status] += 1
        return {"success": True, "data": counts}
''',
    "summary": '''\
        summary = {c: {"capacity": 0, "occupied": 0, "free": 0} for c in self.CATEGORIES}
        for slot_id, slot in sorted(self.$Ss.items()):
            category = slot.get("$CAT")
            if slot.get("status") != $OPEN or category not in self.CATEGORIES:
                continue
            capacity, occupied = slot.get("capacity", 0), self._occupancy(slot_id)
            row = summary[category]
            row["capacity"] += capacity
            row["occupied"] += occupied
            row["free"] += max(capacity - occupied, 0)
        return {"success": True, "data": summary}
''',
}

_DELETE_GATE = '''\
        if record.get("status") != $CLOSED:
            return {"success": False, "error": f"$e {$E_id} is {record.get('status')!r}; only "
                                               f"{$CLOSED!r} $es can be removed"}
'''


def _subs(spec: EnvSpec) -> dict[str, str]:
    d = spec.domain
    return {"Es": spec.Es, "Ss": spec.Ss, "As": spec.As, "E_id": spec.E_id, "S_id": spec.S_id,
            "A_id": spec.A_id, "CAT": spec.CAT, "LOG": spec.log_name, "NEXT": spec.next_name,
            "e": human(d.entity), "es": human(d.entity_plural), "s": human(d.slot),
            "a": human(d.actor), "cat": human(d.category),
            "PENDING": repr(spec.pending), "ACTIVE": repr(spec.active), "CLOSED": repr(spec.closed),
            "OPEN": repr(spec.slot_states[0]),
            "T_DELETE": spec.tool_names.get("delete", "")}


def _attr_check(name: str, spec: Any) -> str:
    if isinstance(spec[0], int):
        lo, hi = spec
        return (f"        if isinstance({name}, bool) or not isinstance({name}, int) "
                f"or not {lo} <= {name} <= {hi}:\n"
                f"            return {{\"success\": False, \"error\": "
                f"\"{name} must be an integer from {lo} to {hi}\"}}\n")
    return (f"        if {name} not in {tuple(spec)!r}:\n"
            f"            return {{\"success\": False, \"error\": "
            f"f\"{name} must be one of {list(spec)}, got {{{name}!r}}\"}}\n")


def tool_defs(spec: EnvSpec) -> list[ToolDef]:
    """Every enabled tool of ``spec``, in family order."""
    sub = _subs(spec)
    d = spec.domain
    e, es, s, ss = sub["e"], sub["es"], sub["s"], human(d.slot_plural)
    cat, a = sub["cat"], sub["a"]
    eid = (spec.E_id, "string", f"Identifier of the {e}, e.g. {spec.entity_id_format.format(7)!r}.")
    sid = (spec.S_id, "string", f"Identifier of the {s}, e.g. {spec.slot_id_format.format(3)!r}.")
    aid = (spec.A_id, "string", f"Identifier of the acting {a}.")
    catp = (spec.CAT, "string", f"The {cat}.")
    out: list[ToolDef] = []

    def add(key, family, kind, desc, params, body, enums=()):
        if key in spec.tool_names:
            out.append(ToolDef(spec.tool_names[key], family, kind, desc, tuple(params),
                               string.Template(body).substitute(sub), tuple(enums)))

    cat_enum = ((spec.CAT, d.categories),)
    add("lookup_name", "lookup_by_name", "query",
        f"Find {es} by exact name (case-insensitive); returns every matching record.",
        [("name", "string", f"Full name of the {e}.")], _BODIES["lookup_name"])
    add("lookup_entity", "lookup_by_id", "query", f"Get one {e} record by its identifier.",
        [eid], _BODIES["lookup_entity"])
    add("lookup_slot", "lookup_by_id", "query",
        f"Get one {s} record by its identifier, with its current occupancy.",
        [sid], _BODIES["lookup_slot"])
    add("list_available", "list_filter", "query",
        f"List open {ss} of a {cat} that still have free capacity, sorted by identifier.",
        [catp], _BODIES["list_available"], cat_enum)
    add("list_by_status", "list_filter", "query", f"List {es} with the given status.",
        [("status", "string", f"One of {list(d.statuses)}.")], _BODIES["list_by_status"],
        (("status", d.statuses),))
    add("activate", "gated_update", "state_change",
        f"Change a {e} from '{spec.pending}' to '{spec.active}'. Fails unless the {e} is "
        f"'{spec.pending}'.", [eid], _BODIES["activate"])
    add("close", "gated_update", "state_change",
        f"Change a {e} from '{spec.active}' to '{spec.closed}' and release its {s}. Fails unless "
        f"the {e} is '{spec.active}'.", [eid], _BODIES["close"])
    add("assign", "reassign", "state_change",
        f"Assign a {e} to a {s}, replacing any current assignment. The {s} must be "
        f"'{spec.slot_states[0]}', match the {e}'s {cat} and have free capacity; the {e} must be "
        f"{' or '.join(repr(x) for x in spec.assignable)}.", [eid, sid], _BODIES["assign"])
    attr_params = [(n, "integer" if isinstance(v[0], int) else "string",
                    f"{human(n).capitalize()}" + (f" ({v[0]}-{v[1]})." if isinstance(v[0], int)
                                                  else f", one of {list(v)}."))
                   for n, v in spec.entity_attrs]
    attr_enums = [(n, tuple(v)) for n, v in spec.entity_attrs if isinstance(v[0], str)]
    create_body = (_BODIES["create_head"]
                   + "".join(_attr_check(n, v) for n, v in spec.entity_attrs)
                   + _BODIES["create_tail"].replace(
                       "$ATTR_FIELDS", ", ".join(f'"{n}": {n}' for n, _ in spec.entity_attrs)))
    add("create", "create", "state_change",
        f"Create a new {e} with status '{spec.pending}' and no {s}; returns the generated "
        f"{spec.E_id}. Names must be unique.",
        [("name", "string", f"Full name of the new {e}."), catp, *attr_params], create_body,
        (*cat_enum, *attr_enums))
    delete_body = _BODIES["delete"].replace(
        "$DELETE_GATE", _DELETE_GATE if spec.delete_requires_closed else "")
    add("delete", "delete", "state_change",
        f"Permanently remove a {e} record on behalf of a {a}, who must hold one of the roles "
        f"{list(spec.delete_roles)}" + (f"; only '{spec.closed}' {es} can be removed."
                                        if spec.delete_requires_closed else "."),
        [eid, aid], delete_body)
    add("permission", "authorization", "query",
        f"Check whether a {a} may run a permission-controlled operation.",
        [aid, ("operation", "string", "Name of the operation (tool), e.g. "
               f"{spec.tool_names.get('delete', '')!r}.")], _BODIES["permission"])
    add("count", "aggregate", "query", f"Count {es} by status.", [], _BODIES["count"])
    add("summary", "aggregate", "query",
        f"Per {cat}: total capacity, occupied and free places over '{spec.slot_states[0]}' {ss}.",
        [], _BODIES["summary"])
    return out


def render_class_source(spec: EnvSpec, tools: list[ToolDef]) -> str:
    perms = {spec.tool_names["delete"]: spec.delete_roles} if spec.has("delete") else {}
    header = _HEADER.substitute(
        _subs(spec), CLASS=spec.class_name, SUMMARY=summary_text(spec),
        CATEGORIES=repr(spec.domain.categories), STATUSES=repr(spec.domain.statuses),
        ASSIGNABLE=repr(spec.assignable), ID_FORMAT=repr(spec.entity_id_format),
        PERMISSIONS=repr(perms))
    return header + "\n".join(t.source() for t in tools)


# ---- descriptive texts ------------------------------------------------------------------------

def summary_text(spec: EnvSpec) -> str:
    d = spec.domain
    where = f" ({spec.region} branch)" if spec.region else ""
    return (f"{d.title}{where}: tracks {human(d.entity_plural)} through the lifecycle "
            f"{' -> '.join(d.statuses)}, assigns them to {human(d.slot_plural)} by "
            f"{human(d.category)} under capacity limits, and records which {human(d.actor)} "
            f"removed a record.")


def _a(word: str) -> str:
    """``word`` with its indefinite article."""
    return f"{'an' if word[:1] in 'aeiou' else 'a'} {word}"


def constraints_for(spec: EnvSpec) -> tuple[str, ...]:
    d = spec.domain
    e, s, es = human(d.entity), human(d.slot), human(d.entity_plural)
    open_ = spec.slot_states[0]
    rules = [f"Every {e} has exactly one status among {list(d.statuses)}.",
             f"{_a(e).capitalize()} can only become '{spec.active}' from '{spec.pending}', and "
             f"only become '{spec.closed}' from '{spec.active}'.",
             f"When {_a(e)} becomes '{spec.closed}' its {s} is released.",
             f"{_a(e).capitalize()} can only be assigned to a {s} whose status is '{open_}' and "
             f"whose {human(d.category)} matches, and only while the {s} has free capacity.",
             f"Only {' or '.join(repr(x) for x in spec.assignable)} {es} can be assigned to "
             f"{_a(s)}.",
             f"{_a(s).capitalize()} never holds more {es} than its capacity."]
    if spec.has("create"):
        rules.append(f"New {es} start as '{spec.pending}' with no {s}; {e} names are unique and "
                     f"identifiers are issued in sequence.")
    if spec.has("delete"):
        rules.append(f"Only {human(d.actor_plural)} with role {list(spec.delete_roles)} may remove "
                     f"{e} records; every removal is logged with the acting {human(d.actor)}.")
        if spec.delete_requires_closed:
            rules.append(f"Only '{spec.closed}' {es} may be removed.")
    return tuple(rules)


def state_space_for(spec: EnvSpec) -> tuple[dict[str, str], ...]:
    d = spec.domain
    attrs = ", ".join(n for n, _ in spec.entity_attrs)
    return (
        {"entity": spec.Es, "attributes": f"{spec.E_id}, name, status, {spec.CAT}, {spec.S_id}, {attrs}",
         "description": f"{human(d.entity_plural).capitalize()} keyed by {spec.E_id}."},
        {"entity": spec.Ss, "attributes": f"{spec.S_id}, {spec.CAT}, capacity, status, {d.slot_attr[0]}",
         "description": f"{human(d.slot_plural).capitalize()} keyed by {spec.S_id}; status is "
                        f"'{spec.slot_states[0]}' or '{spec.slot_states[1]}'."},
        {"entity": spec.As, "attributes": f"{spec.A_id}, name, role",
         "description": f"{human(d.actor_plural).capitalize()} with roles {list(d.roles)}."},
        {"entity": spec.log_name, "attributes": f"{spec.E_id}, name, removed_by",
         "description": f"Log of removed {human(d.entity_plural)}."},
        {"entity": spec.next_name, "attributes": "integer",
         "description": f"Number used for the next generated {spec.E_id}."},
    )


def build_environment(spec: EnvSpec) -> Environment:
    tools = tool_defs(spec)
    d = spec.domain
    branch = f" of the {spec.region} branch" if spec.region else ""
    intro = (f"You operate the {d.title} system{branch}. "
             f"{human(d.entity_plural).capitalize()} are assigned to {human(d.slot_plural)}; "
             f"{human(d.actor_plural)} act on the records.")
    return Environment(
        env_id=spec.env_id, class_name=spec.class_name, summary=summary_text(spec),
        tools=tuple(t.schema() for t in tools), state_space=state_space_for(spec),
        constraints=constraints_for(spec),
        operations=tuple(Operation(t.name, t.description, t.kind) for t in tools),
        class_source=render_class_source(spec, tools), introduction=intro,
        metadata={"generator": "envsched_jax.pool.generator", "seed": spec.seed,
                  "index": spec.index, "domain": d.key, "region": spec.region,
                  "families": list(spec.families),
                  "rules": {"assign_requires_active": spec.assign_requires_active,
                            "delete_requires_closed": spec.delete_requires_closed,
                            "delete_roles": list(spec.delete_roles)},
                  "tool_families": {t.name: t.family for t in tools}})
