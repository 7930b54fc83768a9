"""Task templates: per-task initial states, instructions, verifier checks and reference actions.

A template needs a set of operation families; an environment samples its tasks only from the
templates its families allow, so the same template (e.g. "create a record, then place it in a free
slot") appears in many domains while the tasks of one environment cycle through different ones.

Every template builds a small random scene (5-20 records), bends it so that its scenario holds
(a free slot exists, a gate fails, ...), and derives the expected outcome directly from the scene
and the environment's rules. Nothing is executed here; the tests replay every reference action
sequence against the rendered class.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable
from typing import Any

from envsched_jax.pool.generator.domains import FIRST_NAMES, ITEM_WORDS, LAST_NAMES, PERSON, human
from envsched_jax.pool.generator.environment import EnvSpec
from envsched_jax.pool.generator.stream import Stream
from envsched_jax.pool.model import Action, Check, Task

CHAT = "chat_with_user"


# ---- scenes: the initial state of one task ----------------------------------------------------

class Scene:
    """A mutable initial state under construction, plus the helpers templates need.

    A fresh scene has 4-8 entities, 3-5 slots and 3 actors; templates add at most two slots and
    two entities, so an initial state never exceeds 20 records.
    """

    def __init__(self, spec: EnvSpec, st: Stream):
        self.spec, self.st = spec, st
        d = spec.domain
        self.names: set[str] = set()
        self.entities: dict[str, dict[str, Any]] = {}
        self.slots: dict[str, dict[str, Any]] = {}
        self.actors: dict[str, dict[str, Any]] = {}
        self._slot_no = st.between(1, 40)
        self._entity_no = st.between(1, 300)
        self.next_number = 0  # the create tool's counter; always above every existing id
        for _ in range(st.between(3, 5)):
            self.add_slot(st.choice(d.categories), open_=st.chance(0.85))
        for _ in range(st.between(4, 8)):
            status = d.statuses[self._weighted_status()]
            category = st.choice(d.categories)
            slot = None
            if status == spec.active and st.chance(0.8):
                free = self.available(category)
                slot = st.choice(free) if free else None
            self.add_entity(status, category, slot)
        roles = list(d.roles)
        allowed = [r for r in roles if r in spec.delete_roles]
        denied = [r for r in roles if r not in spec.delete_roles]
        actor_roles = [st.choice(allowed), st.choice(denied), st.choice(roles)]
        actor_no = st.between(1, 20)
        for role in st.shuffled(actor_roles):
            aid = sys.intern(spec.actor_id_format.format(actor_no))
            actor_no += st.between(1, 5)
            self.actors[aid] = {spec.A_id: aid, "name": self.new_name(person=True), "role": role}
        self.next_number = self._entity_no + st.between(0, 20)

    def _weighted_status(self) -> int:
        u = self.st.uniform()
        return 0 if u < 0.35 else 1 if u < 0.8 else 2

    def new_name(self, person: bool = False) -> str:
        d, st = self.spec.domain, self.st
        while True:
            if person or d.names == PERSON:
                name = f"{st.choice(FIRST_NAMES)} {st.choice(LAST_NAMES)}"
            else:
                name = f"{st.choice(ITEM_WORDS)} {st.choice(d.names)} {st.between(2, 99)}"
            if name not in self.names:
                self.names.add(name)
                return sys.intern(name)  # shared across tasks: pools of 100k tasks stay small

    def attr_value(self, spec: Any) -> Any:
        return self.st.between(*spec) if isinstance(spec[0], int) else self.st.choice(spec)

    def add_slot(self, category: str, open_: bool = True, capacity: int | None = None) -> str:
        sp, st = self.spec, self.st
        sid = sys.intern(sp.slot_id_format.format(self._slot_no))
        self._slot_no += st.between(1, 7)
        attr_name, attr_spec = sp.domain.slot_attr
        self.slots[sid] = {sp.S_id: sid, sp.CAT: category,
                           "capacity": capacity if capacity is not None else st.between(*sp.domain.capacity),
                           "status": sp.slot_states[0 if open_ else 1],
                           attr_name: self.attr_value(attr_spec)}
        return sid

    def add_entity(self, status: str, category: str, slot: str | None = None) -> str:
        sp = self.spec
        eid = sys.intern(sp.entity_id_format.format(self._entity_no))
        self._entity_no += self.st.between(1, 9)
        rec = {sp.E_id: eid, "name": self.new_name(), "status": status, sp.CAT: category,
               sp.S_id: slot}
        for name, spec in sp.entity_attrs:
            rec[name] = self.attr_value(spec)
        self.entities[eid] = rec
        self.next_number = max(self.next_number, self._entity_no)
        return eid

    def occupancy(self, sid: str) -> int:
        S_id = self.spec.S_id
        return sum(1 for r in self.entities.values() if r[S_id] == sid)

    def available(self, category: str) -> list[str]:
        """Open slots of ``category`` with free capacity, sorted: what the list tool returns."""
        sp = self.spec
        return [sid for sid, s in sorted(self.slots.items())
                if s[sp.CAT] == category and s["status"] == sp.slot_states[0]
                and s["capacity"] > self.occupancy(sid)]

    def pick_entity(self, statuses: tuple[str, ...], exclude: tuple[str, ...] = ()) -> str:
        """An entity with one of ``statuses``; one is converted if none exists."""
        cands = [k for k, r in self.entities.items() if r["status"] in statuses and k not in exclude]
        if cands:
            return self.st.choice(sorted(cands))
        eid = self.st.choice(sorted(k for k in self.entities if k not in exclude))
        self.set_status(eid, self.st.choice(statuses))
        return eid

    def set_status(self, eid: str, status: str) -> None:
        rec = self.entities[eid]
        rec["status"] = status
        if status != self.spec.active:
            rec[self.spec.S_id] = None

    def free_slot(self, category: str, exclude: tuple[str | None, ...] = ()) -> str:
        """A slot that can take one more entity of ``category`` (created if none exists)."""
        cands = [s for s in self.available(category) if s not in exclude]
        return self.st.choice(cands) if cands else self.add_slot(category)

    def blocked_slot(self, category: str, exclude: tuple[str | None, ...] = ()) -> str:
        """A slot of ``category`` that refuses new entities: full or not open."""
        sp = self.spec
        free = set(self.available(category))
        cands = [s for s, r in sorted(self.slots.items())
                 if r[sp.CAT] == category and s not in free and s not in exclude]
        if cands:
            return self.st.choice(cands)
        if self.st.chance(0.5):
            return self.add_slot(category, open_=False)
        sid = self.add_slot(category, capacity=self.st.between(1, 2))
        for _ in range(self.slots[sid]["capacity"]):
            self.add_entity(sp.active, category, sid)
        return sid

    def new_entity_args(self, category: str) -> tuple[str, dict[str, Any]]:
        name = self.new_name()
        args = {"name": name, self.spec.CAT: category}
        for attr, spec in self.spec.entity_attrs:
            args[attr] = self.attr_value(spec)
        return name, args

    def allowed_actor(self) -> str:
        return self.st.choice(sorted(a for a, r in self.actors.items()
                                     if r["role"] in self.spec.delete_roles))

    def denied_actor(self) -> str:
        return self.st.choice(sorted(a for a, r in self.actors.items()
                                     if r["role"] not in self.spec.delete_roles))

    def state(self) -> dict[str, Any]:
        sp = self.spec
        return {sp.Es: self.entities, sp.Ss: self.slots, sp.As: self.actors, sp.log_name: [],
                sp.next_name: self.next_number}


# ---- checks -------------------------------------------------------------------------------------

def _check(text: str, body: str) -> Check:
    return Check(text, "def check_func(final_state):\n" + body)


def chk_field(text: str, table: str, rid: str, field: str, value: Any) -> Check:
    return _check(text, f"    rec = final_state.get({table!r}, {{}}).get({rid!r})\n"
                        f"    return rec is not None and rec.get({field!r}) == {value!r}\n")


def chk_field_in(text: str, table: str, rid: str, field: str, values: list[Any]) -> Check:
    return _check(text, f"    rec = final_state.get({table!r}, {{}}).get({rid!r})\n"
                        f"    return rec is not None and rec.get({field!r}) in {values!r}\n")


def chk_record_unchanged(text: str, table: str, rid: str, ignore: tuple[str, ...] = ()) -> Check:
    return _check(text, f"    before = dict(initial_state[{table!r}][{rid!r}])\n"
                        f"    after = final_state.get({table!r}, {{}}).get({rid!r})\n"
                        f"    if after is None:\n        return False\n"
                        f"    after = dict(after)\n"
                        f"    for key in {list(ignore)!r}:\n"
                        f"        before.pop(key, None)\n        after.pop(key, None)\n"
                        f"    return after == before\n")


def chk_others_unchanged(text: str, table: str, exclude: list[str]) -> Check:
    return _check(text, f"    after = final_state.get({table!r}, {{}})\n"
                        f"    skip = {sorted(exclude)!r}\n"
                        f"    return all(after.get(k) == v for k, v in initial_state[{table!r}].items()"
                        f" if k not in skip)\n")


@functools.lru_cache(maxsize=4096)  # identical across many tasks: share one record
def chk_count(text: str, table: str, delta: int) -> Check:
    return _check(text, f"    return len(final_state.get({table!r}, {{}})) == "
                        f"len(initial_state[{table!r}]) + {delta}\n")


def chk_absent(text: str, table: str, rid: str) -> Check:
    return _check(text, f"    return {rid!r} not in final_state.get({table!r}, {{}})\n")


def chk_capacity(text: str, sp: EnvSpec) -> Check:
    return _chk_capacity(text, sp.Ss, sp.Es, sp.S_id)


@functools.lru_cache(maxsize=4096)
def _chk_capacity(text: str, Ss: str, Es: str, S_id: str) -> Check:
    return _check(text, f"    slots = final_state.get({Ss!r}, {{}})\n"
                        f"    held = {{}}\n"
                        f"    for rec in final_state.get({Es!r}, {{}}).values():\n"
                        f"        sid = rec.get({S_id!r})\n"
                        f"        if sid is not None:\n"
                        f"            held[sid] = held.get(sid, 0) + 1\n"
                        f"    return all(sid in slots and n <= slots[sid].get('capacity', 0)"
                        f" for sid, n in held.items())\n")


def chk_logged(text: str, sp: EnvSpec, rid: str, actor: str) -> Check:
    return _check(text, f"    log = final_state.get({sp.log_name!r}, [])\n"
                        f"    return any(e.get({sp.E_id!r}) == {rid!r} and e.get('removed_by') == "
                        f"{actor!r} for e in log)\n")


def chk_not_logged_by(text: str, sp: EnvSpec, actor: str) -> Check:
    return _check(text, f"    log = final_state.get({sp.log_name!r}, [])\n"
                        f"    return all(e.get('removed_by') != {actor!r} for e in log)\n")


def chk_new_record(text: str, sp: EnvSpec, name: str, fields: dict[str, Any]) -> Check:
    return _check(text, f"    found = [r for r in final_state.get({sp.Es!r}, {{}}).values()"
                        f" if r.get('name') == {name!r}]\n"
                        f"    want = {fields!r}\n"
                        f"    return len(found) == 1 and all(found[0].get(k) == v"
                        f" for k, v in want.items())\n")


def chk_new_record_field_in(text: str, sp: EnvSpec, name: str, field: str, values: list) -> Check:
    return _check(text, f"    found = [r for r in final_state.get({sp.Es!r}, {{}}).values()"
                        f" if r.get('name') == {name!r}]\n"
                        f"    return len(found) == 1 and found[0].get({field!r}) in {values!r}\n")


# ---- templates ----------------------------------------------------------------------------------

@dataclasses.dataclass
class Draft:
    instruction: str
    checks: list[Check]
    actions: list[Action]
    families: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Template:
    name: str
    needs: frozenset[str]
    build: Callable[[Scene], Draft]


def _say(sc: Scene, options: list[str]) -> str:
    """One phrasing, with an optional opener and closer."""
    st = sc.st
    text = st.choice(options)
    if st.chance(0.3):
        text = st.choice(("Hi! ", "Hello, ", "Good morning. ", "Quick request: ")) + text
    if st.chance(0.4):
        text += st.choice((" Thanks!", " Let me know once it's done.", " Please confirm when finished.",
                           " Thank you."))
    return text


def _call(tool: str, **arguments: Any) -> Action:
    return Action(tool, arguments)


def _chat(message: str) -> Action:
    return Action(CHAT, {"message": message})


def _words(sp: EnvSpec) -> dict[str, str]:
    d = sp.domain
    return {"e": human(d.entity), "es": human(d.entity_plural), "s": human(d.slot),
            "ss": human(d.slot_plural), "cat": human(d.category), "a": human(d.actor),
            "v0": human(d.verbs[0]), "v1": human(d.verbs[1])}


def _transition(sc: Scene, by_name: bool) -> Draft:
    sp, st, w = sc.spec, sc.st, _words(sc.spec)
    activate = st.chance(0.5)
    eid = sc.pick_entity((sp.pending,) if activate else (sp.active,))
    rec = sc.entities[eid]
    verb, tool, new = ((w["v0"], sp.tool("activate"), sp.active) if activate
                       else (w["v1"], sp.tool("close"), sp.closed))
    who = f"{rec['name']}" if by_name else f"{w['e']} {eid}"
    instruction = _say(sc, [f"Please {verb} {who}.", f"Can you {verb} {who}?",
                            f"{who[0].upper() + who[1:]} should now be marked '{new}'."
                            f" Use the {verb} operation."])
    actions = ([_call(sp.tool("lookup_name"), name=rec["name"])] if by_name else [])
    actions += [_call(tool, **{sp.E_id: eid}), _chat(f"{rec['name']} ({eid}) is now '{new}'.")]
    checks = [chk_field(f"{w['e']} {eid} has status '{new}'", sp.Es, eid, "status", new),
              chk_others_unchanged(f"no other {w['e']} record changed", sp.Es, [eid])]
    if activate:
        checks.append(chk_record_unchanged(f"{w['e']} {eid} keeps all fields other than its status",
                                           sp.Es, eid, ("status",)))
    else:
        checks.append(chk_field(f"{w['e']} {eid} no longer holds a {w['s']}", sp.Es, eid, sp.S_id, None))
    fams = (("lookup_by_name",) if by_name else ()) + ("gated_update",)
    return Draft(instruction, checks, actions, fams)


def t_transition_by_id(sc: Scene) -> Draft:
    return _transition(sc, by_name=False)


def t_transition_by_name(sc: Scene) -> Draft:
    return _transition(sc, by_name=True)


def t_conditional_transition(sc: Scene) -> Draft:
    sp, w = sc.spec, _words(sc.spec)
    eid = sc.pick_entity((sp.pending, sp.active))
    rec = sc.entities[eid]
    activate = rec["status"] == sp.pending
    tool, new = (sp.tool("activate"), sp.active) if activate else (sp.tool("close"), sp.closed)
    instruction = _say(sc, [
        f"Look up {w['e']} {eid}. If it is '{sp.pending}', {w['v0']} it; if it is already "
        f"'{sp.active}', {w['v1']} it instead.",
        f"Check the status of {w['e']} {eid}: a '{sp.pending}' record should be moved to "
        f"'{sp.active}', an '{sp.active}' one to '{sp.closed}'."])
    actions = [_call(sp.tool("lookup_entity"), **{sp.E_id: eid}), _call(tool, **{sp.E_id: eid}),
               _chat(f"{eid} was '{rec['status']}', so it is now '{new}'.")]
    checks = [chk_field(f"{w['e']} {eid} has status '{new}'", sp.Es, eid, "status", new),
              chk_others_unchanged(f"no other {w['e']} record changed", sp.Es, [eid]),
              chk_count(f"the number of {w['es']} is unchanged", sp.Es, 0)]
    return Draft(instruction, checks, actions, ("lookup_by_id", "gated_update"))


def t_partial_gate_failure(sc: Scene) -> Draft:
    sp, st, w = sc.spec, sc.st, _words(sc.spec)
    activate = st.chance(0.5)
    need = sp.pending if activate else sp.active
    wrong = tuple(s for s in sp.domain.statuses if s != need)
    good = sc.pick_entity((need,))
    bad = sc.pick_entity(wrong, exclude=(good,))
    verb, tool, new = ((w["v0"], sp.tool("activate"), sp.active) if activate
                       else (w["v1"], sp.tool("close"), sp.closed))
    order = [good, bad] if st.chance(0.5) else [bad, good]
    instruction = _say(sc, [f"Please {verb} {w['es']} {order[0]} and {order[1]}.",
                            f"Both {order[0]} and {order[1]} need to be {verb}-processed "
                            f"(status '{new}'). Handle whatever the rules allow."])
    actions = [_call(tool, **{sp.E_id: k}) for k in order]
    actions.append(_chat(f"{good} is now '{new}'. {bad} could not be changed: it is "
                         f"'{sc.entities[bad]['status']}', not '{need}'."))
    checks = [chk_field(f"{w['e']} {good} has status '{new}'", sp.Es, good, "status", new),
              chk_record_unchanged(f"{w['e']} {bad}, which is not '{need}', is left unchanged",
                                   sp.Es, bad),
              chk_others_unchanged(f"no other {w['e']} record changed", sp.Es, [good]),
              chk_count(f"the number of {w['es']} is unchanged", sp.Es, 0)]
    return Draft(instruction, checks, actions, ("gated_update",))


def _assign(sc: Scene, by_name: bool) -> Draft:
    sp, w = sc.spec, _words(sc.spec)
    eid = sc.pick_entity(sp.assignable)
    rec = sc.entities[eid]
    sid = sc.free_slot(rec[sp.CAT], exclude=(rec[sp.S_id],))
    who = rec["name"] if by_name else f"{w['e']} {eid}"
    move = "Move" if rec[sp.S_id] else "Assign"
    instruction = _say(sc, [f"{move} {who} to {w['s']} {sid}.",
                            f"Please put {who} in {w['s']} {sid}.",
                            f"{w['s'].capitalize()} {sid} should now hold {who}."])
    actions = ([_call(sp.tool("lookup_name"), name=rec["name"])] if by_name else [])
    actions += [_call(sp.tool("assign"), **{sp.E_id: eid, sp.S_id: sid}),
                _chat(f"{rec['name']} ({eid}) is now assigned to {sid}.")]
    checks = [chk_field(f"{w['e']} {eid} is assigned to {w['s']} {sid}", sp.Es, eid, sp.S_id, sid),
              chk_record_unchanged(f"{w['e']} {eid} keeps its status and details", sp.Es, eid,
                                   (sp.S_id,)),
              chk_others_unchanged(f"no other {w['e']} record changed", sp.Es, [eid]),
              chk_capacity(f"no {w['s']} holds more {w['es']} than its capacity", sp)]
    fams = (("lookup_by_name",) if by_name else ()) + ("reassign",)
    return Draft(instruction, checks, actions, fams)


def t_assign_by_id(sc: Scene) -> Draft:
    return _assign(sc, by_name=False)


def t_assign_by_name(sc: Scene) -> Draft:
    return _assign(sc, by_name=True)


def t_assign_find_free(sc: Scene) -> Draft:
    sp, w = sc.spec, _words(sc.spec)
    eid = sc.pick_entity(sp.assignable)
    rec = sc.entities[eid]
    cat, current = rec[sp.CAT], rec[sp.S_id]
    sc.free_slot(cat, exclude=(current,))
    ok = [s for s in sc.available(cat) if s != current]
    where = f"another {cat} {w['s']}" if current else f"an available {cat} {w['s']}"
    instruction = _say(sc, [f"{rec['name']} ({eid}) needs {where}. Find one and assign it.",
                            f"Please find {where} for {w['e']} {eid} and make the assignment."])
    actions = [_call(sp.tool("list_available"), **{sp.CAT: cat}),
               _call(sp.tool("assign"), **{sp.E_id: eid, sp.S_id: ok[0]}),
               _chat(f"{eid} is now in {w['s']} {ok[0]}.")]
    checks = [chk_field_in(f"{w['e']} {eid} is assigned to one of the {cat} {w['ss']} that had room",
                           sp.Es, eid, sp.S_id, ok),
              chk_others_unchanged(f"no other {w['e']} record changed", sp.Es, [eid]),
              chk_capacity(f"no {w['s']} holds more {w['es']} than its capacity", sp)]
    return Draft(instruction, checks, actions, ("list_filter", "reassign"))


def t_assign_fallback(sc: Scene) -> Draft:
    sp, w = sc.spec, _words(sc.spec)
    eid = sc.pick_entity(sp.assignable)
    rec = sc.entities[eid]
    cat, current = rec[sp.CAT], rec[sp.S_id]
    blocked = sc.blocked_slot(cat, exclude=(current,))
    sc.free_slot(cat, exclude=(current, blocked))
    ok = [s for s in sc.available(cat) if s not in (current, blocked)]
    instruction = _say(sc, [
        f"Assign {w['e']} {eid} to {w['s']} {blocked}. If that {w['s']} cannot take them, use any "
        f"other available {cat} {w['s']} instead.",
        f"{rec['name']} ({eid}) asked for {w['s']} {blocked}; if it's unavailable, pick another "
        f"{cat} {w['s']} with room."])
    actions = [_call(sp.tool("assign"), **{sp.E_id: eid, sp.S_id: blocked}),
               _call(sp.tool("list_available"), **{sp.CAT: cat}),
               _call(sp.tool("assign"), **{sp.E_id: eid, sp.S_id: ok[0]}),
               _chat(f"{blocked} was unavailable, so {eid} is now in {ok[0]}.")]
    checks = [chk_field_in(f"{w['e']} {eid} ends up in an available {cat} {w['s']} other than "
                           f"{blocked}", sp.Es, eid, sp.S_id, ok),
              chk_others_unchanged(f"no other {w['e']} record changed", sp.Es, [eid]),
              chk_capacity(f"no {w['s']} holds more {w['es']} than its capacity", sp),
              chk_count(f"the number of {w['es']} is unchanged", sp.Es, 0)]
    return Draft(instruction, checks, actions, ("reassign", "list_filter"))


def _create_steps(sc: Scene, category: str) -> tuple[str, dict[str, Any], str, list[Action], str]:
    """Create-then-place actions for a new entity in ``category``; returns (name, args, new id,
    actions up to the assignment, slot)."""
    sp = sc.spec
    sc.free_slot(category)
    slot = sc.available(category)[0]
    name, args = sc.new_entity_args(category)
    new_id = sp.entity_id_format.format(sc.next_number)
    acts = [_call(sp.tool("create"), **args)]
    if sp.assign_requires_active:
        acts.append(_call(sp.tool("activate"), **{sp.E_id: new_id}))
    acts.append(_call(sp.tool("list_available"), **{sp.CAT: category}))
    acts.append(_call(sp.tool("assign"), **{sp.E_id: new_id, sp.S_id: slot}))
    return name, args, new_id, acts, slot


def _describe_args(sp: EnvSpec, args: dict[str, Any]) -> str:
    parts = [f"{human(sp.CAT)} '{args[sp.CAT]}'"] if sp.CAT in args else []
    parts += [f"{human(k)} {v!r}" if isinstance(v, str) else f"{human(k)} {v}"
              for k, v in args.items() if k not in ("name", sp.CAT)]
    return ", ".join(parts)


def t_create_and_assign(sc: Scene) -> Draft:
    sp, st, w = sc.spec, sc.st, _words(sc.spec)
    cat = st.choice(sp.domain.categories)
    name, args, new_id, acts, _ = _create_steps(sc, cat)
    ok = sc.available(cat)
    instruction = _say(sc, [
        f"Add a new {w['e']} named {name} ({_describe_args(sp, args)}) and place them in any "
        f"available {cat} {w['s']}.",
        f"We have a new {w['e']}: {name}, {_describe_args(sp, args)}. Create the record and get "
        f"them into a {cat} {w['s']} with room."])
    acts.append(_chat(f"Created {name} as {new_id} and assigned a {w['s']}."))
    checks = [chk_new_record(f"exactly one {w['e']} named {name} exists with the requested details",
                             sp, name, args),
              chk_new_record_field_in(f"{name} is assigned to a {cat} {w['s']} that had room",
                                      sp, name, sp.S_id, ok),
              chk_count(f"exactly one {w['e']} was added", sp.Es, 1),
              chk_others_unchanged(f"existing {w['e']} records are unchanged", sp.Es, []),
              chk_capacity(f"no {w['s']} holds more {w['es']} than its capacity", sp)]
    fams = ("create", "list_filter", "reassign") + (("gated_update",) if sp.assign_requires_active else ())
    return Draft(instruction, checks, acts, fams)


def t_aggregate_place_new(sc: Scene) -> Draft:
    sp, st, w = sc.spec, sc.st, _words(sc.spec)
    free = _free_by_category(sc)
    top = max(free.values())
    leaders = [c for c in sp.domain.categories if free[c] == top]
    if len(leaders) > 1 or top == 0:
        best = st.choice(leaders)
        sc.add_slot(best, capacity=max(sp.domain.capacity[1], 1))
        free = _free_by_category(sc)
    best = max(sp.domain.categories, key=lambda c: free[c])
    name, args, new_id, acts, _ = _create_steps(sc, best)
    ok = sc.available(best)
    instruction = _say(sc, [
        f"Register {name} as a new {w['e']} (details: "
        f"{_describe_args(sp, {k: v for k, v in args.items() if k != sp.CAT})}) in whichever "
        f"{w['cat']} currently has the most free {w['s']} capacity, and assign them a {w['s']} there.",
        f"Which {w['cat']} has the most free places right now? Add {name} "
        f"({_describe_args(sp, {k: v for k, v in args.items() if k != sp.CAT})}) to that "
        f"{w['cat']} and give them a {w['s']} in it."])
    acts.insert(0, _call(sp.tool("summary")))
    acts.append(_chat(f"{best} had the most free capacity; {name} is {new_id} there."))
    checks = [chk_new_record(f"exactly one {w['e']} named {name} exists, in {w['cat']} {best}, "
                             "with the requested details", sp, name, args),
              chk_new_record_field_in(f"{name} holds a {best} {w['s']} that had room",
                                      sp, name, sp.S_id, ok),
              chk_count(f"exactly one {w['e']} was added", sp.Es, 1),
              chk_capacity(f"no {w['s']} holds more {w['es']} than its capacity", sp)]
    fams = ("aggregate", "create", "list_filter", "reassign") + (
        ("gated_update",) if sp.assign_requires_active else ())
    return Draft(instruction, checks, acts, fams)


def _free_by_category(sc: Scene) -> dict[str, int]:
    sp = sc.spec
    free = {c: 0 for c in sp.domain.categories}
    for sid, s in sc.slots.items():
        if s["status"] == sp.slot_states[0]:
            free[s[sp.CAT]] += max(s["capacity"] - sc.occupancy(sid), 0)
    return free


def t_delete_authorized(sc: Scene) -> Draft:
    sp, w = sc.spec, _words(sc.spec)
    statuses = (sp.closed,) if sp.delete_requires_closed else sp.domain.statuses
    eid = sc.pick_entity(statuses)
    actor = sc.allowed_actor()
    an = sc.actors[actor]["name"]
    verb = human(sp.domain.delete_verb)
    instruction = _say(sc, [
        f"This is {an} ({w['a']} id {actor}). Please {verb} the record of {w['e']} {eid}.",
        f"On behalf of {w['a']} {actor} ({an}), permanently {verb} {w['e']} {eid}."])
    actions = [_call(sp.tool("delete"), **{sp.E_id: eid, sp.A_id: actor}),
               _chat(f"{eid} was removed by {actor}.")]
    checks = [chk_absent(f"{w['e']} {eid} no longer exists", sp.Es, eid),
              chk_logged(f"the removal of {eid} is logged under {actor}", sp, eid, actor),
              chk_others_unchanged(f"no other {w['e']} record changed", sp.Es, [eid]),
              chk_count(f"exactly one {w['e']} was removed", sp.Es, -1)]
    return Draft(instruction, checks, actions, ("delete",))


def t_delete_escalate(sc: Scene) -> Draft:
    sp, w = sc.spec, _words(sc.spec)
    statuses = (sp.closed,) if sp.delete_requires_closed else sp.domain.statuses
    eid = sc.pick_entity(statuses)
    asker, backup = sc.denied_actor(), sc.allowed_actor()
    an, bn = sc.actors[asker]["name"], sc.actors[backup]["name"]
    verb = human(sp.domain.delete_verb)
    instruction = _say(sc, [
        f"{an} ({w['a']} {asker}) wants {w['e']} {eid} {verb}d. Only do it under an account that "
        f"is allowed to: if {an} lacks permission, act as {bn} ({backup}) instead.",
        f"Please {verb} {w['e']} {eid} for {an} ({asker}). Check the permission first; if "
        f"{asker} may not do it, use {w['a']} {backup} ({bn})."])
    actions = [_call(sp.tool("permission"), **{sp.A_id: asker, "operation": sp.tool("delete")}),
               _call(sp.tool("delete"), **{sp.E_id: eid, sp.A_id: backup}),
               _chat(f"{asker} is not authorised, so {backup} removed {eid}.")]
    checks = [chk_absent(f"{w['e']} {eid} no longer exists", sp.Es, eid),
              chk_logged(f"the removal of {eid} is logged under {backup}", sp, eid, backup),
              chk_not_logged_by(f"nothing is logged as removed by the unauthorised {asker}", sp, asker),
              chk_others_unchanged(f"no other {w['e']} record changed", sp.Es, [eid])]
    return Draft(instruction, checks, actions, ("authorization", "delete"))


def t_batch_close_category(sc: Scene) -> Draft:
    sp, st, w = sc.spec, sc.st, _words(sc.spec)
    cat = st.choice(sp.domain.categories)
    targets = sorted(k for k, r in sc.entities.items() if r["status"] == sp.active and r[sp.CAT] == cat)
    if not targets:
        eid = sc.pick_entity((sp.pending, sp.closed))
        sc.entities[eid][sp.CAT] = cat
        sc.set_status(eid, sp.active)
        targets = [eid]
    if len(targets) > 3:  # keep tasks short: leave only three to process
        for eid in targets[3:]:
            sc.set_status(eid, sp.pending)
        targets = targets[:3]
    instruction = _say(sc, [
        f"{w['v1'].capitalize()} every '{sp.active}' {w['e']} in {w['cat']} {cat}.",
        f"All {w['es']} in {cat} that are currently '{sp.active}' should become '{sp.closed}'."])
    actions = [_call(sp.tool("list_by_status"), status=sp.active)]
    actions += [_call(sp.tool("close"), **{sp.E_id: k}) for k in targets]
    actions.append(_chat(f"Done: {', '.join(targets)} are now '{sp.closed}'."))
    checks = [_check(f"every '{sp.active}' {w['e']} of {cat} is now '{sp.closed}'",
                     f"    recs = final_state.get({sp.Es!r}, {{}})\n"
                     f"    return all(recs.get(k, {{}}).get('status') == {sp.closed!r}"
                     f" for k in {targets!r})\n"),
              _check(f"those {w['es']} no longer hold a {w['s']}",
                     f"    recs = final_state.get({sp.Es!r}, {{}})\n"
                     f"    return all(k in recs and recs[k].get({sp.S_id!r}) is None"
                     f" for k in {targets!r})\n"),
              chk_others_unchanged(f"{w['es']} outside {cat} or not '{sp.active}' are unchanged",
                                   sp.Es, targets),
              chk_count(f"the number of {w['es']} is unchanged", sp.Es, 0)]
    return Draft(instruction, checks, actions, ("list_filter", "gated_update"))


def t_aggregate_conditional(sc: Scene) -> Draft:
    sp, st, w = sc.spec, sc.st, _words(sc.spec)
    x = sc.pick_entity((sp.pending,))
    y = sc.pick_entity((sp.active,), exclude=(x,))
    pending = sum(1 for r in sc.entities.values() if r["status"] == sp.pending)
    first = st.chance(0.5)
    limit = st.between(max(pending - 2, 0), pending - 1) if first else st.between(pending, pending + 2)
    instruction = _say(sc, [
        f"If more than {limit} {w['es']} are currently '{sp.pending}', {w['v0']} {w['e']} {x}; "
        f"otherwise {w['v1']} {w['e']} {y}.",
        f"Count the '{sp.pending}' {w['es']}. More than {limit}? Then {w['v0']} {x}. If not, "
        f"{w['v1']} {y} instead."])
    target, tool, new, other = ((x, sp.tool("activate"), sp.active, y) if first
                                else (y, sp.tool("close"), sp.closed, x))
    actions = [_call(sp.tool("count")), _call(tool, **{sp.E_id: target}),
               _chat(f"There are {pending} '{sp.pending}' {w['es']}, so {target} is now '{new}'.")]
    checks = [chk_field(f"{w['e']} {target} has status '{new}'", sp.Es, target, "status", new),
              chk_record_unchanged(f"{w['e']} {other} is untouched", sp.Es, other),
              chk_others_unchanged(f"no other {w['e']} record changed", sp.Es, [target])]
    return Draft(instruction, checks, actions, ("aggregate", "gated_update"))


def t_chain_activate_assign(sc: Scene) -> Draft:
    sp, w = sc.spec, _words(sc.spec)
    eid = sc.pick_entity((sp.pending,))
    rec = sc.entities[eid]
    sid = sc.free_slot(rec[sp.CAT])
    instruction = _say(sc, [
        f"{w['v0'].capitalize()} {rec['name']} and then assign them to {w['s']} {sid}.",
        f"{rec['name']} is ready: set them to '{sp.active}' and put them in {w['s']} {sid}."])
    actions = [_call(sp.tool("lookup_name"), name=rec["name"]),
               _call(sp.tool("activate"), **{sp.E_id: eid}),
               _call(sp.tool("assign"), **{sp.E_id: eid, sp.S_id: sid}),
               _chat(f"{rec['name']} ({eid}) is '{sp.active}' and assigned to {sid}.")]
    checks = [chk_field(f"{w['e']} {eid} has status '{sp.active}'", sp.Es, eid, "status", sp.active),
              chk_field(f"{w['e']} {eid} is assigned to {w['s']} {sid}", sp.Es, eid, sp.S_id, sid),
              chk_others_unchanged(f"no other {w['e']} record changed", sp.Es, [eid]),
              chk_capacity(f"no {w['s']} holds more {w['es']} than its capacity", sp)]
    return Draft(instruction, checks, actions, ("lookup_by_name", "gated_update", "reassign"))


def _t(name: str, needs: tuple[str, ...], build: Callable[[Scene], Draft]) -> Template:
    return Template(name, frozenset(needs), build)


TEMPLATES: tuple[Template, ...] = (
    _t("transition_by_id", ("gated_update",), t_transition_by_id),
    _t("transition_by_name", ("lookup_by_name", "gated_update"), t_transition_by_name),
    _t("conditional_transition", ("lookup_by_id", "gated_update"), t_conditional_transition),
    _t("partial_gate_failure", ("gated_update",), t_partial_gate_failure),
    _t("assign_by_id", ("reassign",), t_assign_by_id),
    _t("assign_by_name", ("lookup_by_name", "reassign"), t_assign_by_name),
    _t("assign_find_free", ("list_filter", "reassign"), t_assign_find_free),
    _t("assign_fallback", ("list_filter", "reassign"), t_assign_fallback),
    _t("create_and_assign", ("create", "list_filter", "reassign", "gated_update"), t_create_and_assign),
    _t("aggregate_place_new", ("aggregate", "create", "list_filter", "reassign", "gated_update"),
       t_aggregate_place_new),
    _t("delete_authorized", ("delete",), t_delete_authorized),
    _t("delete_escalate", ("delete", "authorization"), t_delete_escalate),
    _t("batch_close_category", ("list_filter", "gated_update"), t_batch_close_category),
    _t("aggregate_conditional", ("aggregate", "gated_update"), t_aggregate_conditional),
    _t("chain_activate_assign", ("lookup_by_name", "gated_update", "reassign"), t_chain_activate_assign),
)


def templates_for(spec: EnvSpec) -> list[Template]:
    return [t for t in TEMPLATES if t.needs <= set(spec.families)]


def build_task(spec: EnvSpec, template: Template, st: Stream, number: int) -> Task:
    scene = Scene(spec, st)
    draft = template.build(scene)
    return Task(task_id=f"{spec.env_id}-task_{number}", env_id=spec.env_id,
                instruction=draft.instruction, initial_state=scene.state(),
                checks=tuple(draft.checks), reference_actions=tuple(draft.actions),
                metadata={"template": template.name, "families": sorted(draft.families),
                          "domain": spec.domain.key})
