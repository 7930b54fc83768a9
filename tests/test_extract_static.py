"""Static operation extractor on constructed environment classes: writes reached through aliases
(tuple / starred / nested / for unpacking, walrus, ``with``, ``getattr``, rebinding chains,
mutator calls), through helper methods (writing ``self``, writing a parameter, returning an
alias, mutual recursion), control tools (hand-off / end of conversation) and their abstraction."""

from __future__ import annotations

import ast
import textwrap

import pytest

from envsched_jax.graph.extract import ToolInfo, analyse_environment, extract
from envsched_jax.pool.model import Action, Check, Environment, Operation, Task

_INIT = '''
class Shop:
    def __init__(self, init_config):
        cfg = init_config or {}
        self.orders = cfg.get("orders", {})
        self.users = cfg.get("users", {})
        self.log = cfg.get("log", [])
        self.done = False
        self.transferred = False
'''


def _env(methods: str, operations: tuple[Operation, ...] = ()) -> Environment:
    """An environment whose tools are the public methods of ``Shop`` (``_INIT`` + ``methods``);
    each tool's parameters are its method's parameters, all required strings."""
    source = _INIT + textwrap.indent(textwrap.dedent(methods), "    ")
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef))
    tools = []
    for fn in cls.body:
        if isinstance(fn, ast.FunctionDef) and not fn.name.startswith("_"):
            params = [a.arg for a in fn.args.args[1:]]
            tools.append({"type": "function", "function": {
                "name": fn.name, "description": fn.name.replace("_", " "),
                "parameters": {"type": "object", "properties": {p: {"type": "string"} for p in params},
                               "required": params}}})
    return Environment(env_id="shop", class_name="Shop", summary="orders and users", tools=tuple(tools),
                       operations=operations, class_source=source)


def _info(methods: str, name: str, operations: tuple[Operation, ...] = ()) -> ToolInfo:
    return analyse_environment(_env(methods, operations))[name]


def _summary(info: ToolInfo) -> tuple:
    return info.writes, info.state_changing, info.family, info.control


# --------------------------------------------------------------------------------------------
# Aliases inside one method


def test_tuple_unpacking_alias_is_a_write():
    info = _info('''
        def cancel_order(self, order_id):
            orders, users = self.orders, self.users
            if order_id not in orders:
                return {"success": False, "error": "unknown order"}
            orders[order_id]["status"] = "cancelled"
            return {"success": True}
        ''', "cancel_order")
    assert _summary(info) == (frozenset({"orders"}), True, "delete", False)
    assert info.guard_kinds == frozenset({"state_precondition"})


def test_starred_and_nested_unpacking_pair_positions():
    tools = analyse_environment(_env('''
        def flag_user(self, user_id):
            first, *rest = self.orders, self.users, self.log
            rest[0][user_id]["flagged"] = True
        def note_user(self, user_id):
            (count, (orders, users)) = (0, (self.orders, self.users))
            users[user_id]["note"] = "x"
        def peek_orders(self, user_id):
            first, *rest = self.orders, self.users
            first[user_id] = 1
        '''))
    assert _summary(tools["flag_user"]) == (frozenset({"users", "log"}), True, "update", False)
    assert _summary(tools["note_user"]) == (frozenset({"users"}), True, "update", False)
    assert tools["peek_orders"].writes == frozenset({"orders"})


def test_for_items_unpacking_aliases_the_value_not_the_key():
    tools = analyse_environment(_env('''
        def mark_all_orders(self):
            for oid, order in self.orders.items():
                order["seen"] = True
        def list_order_ids(self):
            out = []
            for oid, order in self.orders.items():
                oid = oid.upper()
                out.append(oid)
            return out
        def stamp_orders(self, stamp):
            for k, order in enumerate(self.orders.values()):
                order["stamp"] = stamp
        '''))
    assert _summary(tools["mark_all_orders"]) == (frozenset({"orders"}), True, "update", False)
    assert _summary(tools["list_order_ids"]) == (frozenset(), False, "lookup", False)
    assert tools["stamp_orders"].writes == frozenset({"orders"})


def test_walrus_and_with_aliases():
    tools = analyse_environment(_env('''
        def ship_order(self, order_id):
            if (order := self.orders.get(order_id)) is None:
                return {"success": False, "error": "unknown order"}
            order["status"] = "shipped"
        def rename_user(self, user_id, name):
            with self.users[user_id] as user:
                user["name"] = name
        '''))
    assert _summary(tools["ship_order"]) == (frozenset({"orders"}), True, "update", False)
    assert tools["ship_order"].guard_kinds == frozenset({"state_precondition"})
    assert _summary(tools["rename_user"]) == (frozenset({"users"}), True, "update", False)


def test_getattr_self_is_the_attribute():
    info = _info('''
        def block_user(self, user_id):
            table = getattr(self, "users")
            table[user_id]["blocked"] = True
        ''', "block_user")
    assert _summary(info) == (frozenset({"users"}), True, "update", False)


def test_chain_of_local_rebinding():
    info = _info('''
        def tag_order(self, order_id):
            a = self.orders
            b = a
            c = b[order_id]
            c["tag"] = 1
        ''', "tag_order")
    assert _summary(info) == (frozenset({"orders"}), True, "update", False)


def test_mutator_calls_on_aliases():
    tools = analyse_environment(_env('''
        def add_item(self, order_id, item):
            order = self.orders.setdefault(order_id, {"items": []})
            order["items"].append(item)
        def merge_user(self, user_id, data):
            user = self.users.get(user_id)
            user.update(data)
        def drop_log(self):
            entries = self.log
            entries.clear()
        '''))
    assert _summary(tools["add_item"]) == (frozenset({"orders"}), True, "create", False)
    assert _summary(tools["merge_user"]) == (frozenset({"users"}), True, "update", False)
    assert _summary(tools["drop_log"]) == (frozenset({"log"}), True, "delete", False)


def test_read_only_tool_with_aliases_is_not_state_changing():
    info = _info('''
        def get_user_orders(self, user_id):
            orders, users = self.orders, self.users
            user = users.get(user_id)
            if user is None:
                return {"success": False, "error": "unknown user"}
            hits = [o for o in orders.values() if o["user_id"] == user_id]
            hits.append(user)                 # a fresh list, not state
            safe = user.copy()
            safe.pop("password", None)        # a copy, not state
            hits.sort(key=len)
            return {"success": True, "data": hits + [safe]}
        ''', "get_user_orders")
    assert _summary(info) == (frozenset(), False, "lookup", False)
    assert info.lookup_kind == "entity_by_id"


def test_rebinding_a_local_name_is_not_a_write():
    info = _info('''
        def show_orders(self, order_id):
            orders = self.orders
            orders = dict(orders)
            order = orders.get(order_id)
            order = None
            count = len(self.orders)
            count += 1
            return orders
        ''', "show_orders")
    assert _summary(info) == (frozenset(), False, "lookup", False)


# --------------------------------------------------------------------------------------------
# Helper methods (a fixpoint over the class)


def test_helper_writing_self_counts_for_the_caller():
    tools = analyse_environment(_env('''
        def _save(self, entry):
            self.log.append(entry)
        def record_visit(self, user_id):
            self._save({"user": user_id})
        def get_user(self, user_id):
            return self.users[user_id]
        '''))
    assert _summary(tools["record_visit"]) == (frozenset({"log"}), True, "create", False)
    assert _summary(tools["get_user"]) == (frozenset(), False, "lookup", False)


def test_helper_writing_through_a_parameter_writes_what_the_call_site_passes():
    tools = analyse_environment(_env('''
        def _set_status(self, record, status):
            record["status"] = status
        def _touch(self, record):
            self._set_status(record, "touched")
        def hold_order(self, order_id):
            orders, users = self.orders, self.users
            self._set_status(orders[order_id], "held")
        def suspend_user(self, user_id):
            user = self.users[user_id]
            self._touch(record=user)
        def preview_status(self, order_id):
            draft = {"status": None}
            self._set_status(draft, "held")
            return draft
        '''))
    assert _summary(tools["hold_order"]) == (frozenset({"orders"}), True, "update", False)
    assert _summary(tools["suspend_user"]) == (frozenset({"users"}), True, "transition", False)
    assert _summary(tools["preview_status"]) == (frozenset(), False, "lookup", False)


def test_helper_returning_an_alias():
    tools = analyse_environment(_env('''
        def _order(self, order_id):
            return self.orders[order_id]
        def _first_match(self, user_id):
            return next(o for o in self.orders.values() if o["user_id"] == user_id)
        def set_order_note(self, order_id, note):
            order = self._order(order_id)
            order["note"] = note
        def close_latest_order(self, user_id):
            self._first_match(user_id)["status"] = "closed"
        def get_order(self, order_id):
            return self._order(order_id)
        '''))
    assert _summary(tools["set_order_note"]) == (frozenset({"orders"}), True, "update", False)
    assert _summary(tools["close_latest_order"]) == (frozenset({"orders"}), True, "transition", False)
    assert _summary(tools["get_order"]) == (frozenset(), False, "lookup", False)


def test_mutually_recursive_helpers_terminate_with_their_writes():
    tools = analyse_environment(_env('''
        def _ping(self, n, record):
            if n <= 0:
                return record
            return self._pong(n - 1, record)
        def _pong(self, n, record):
            record["hits"] = n
            self.log.append(n)
            return self._ping(n, record)
        def _loop(self):
            return self._loop()
        def bump_order(self, order_id):
            self._ping(3, self.orders[order_id])
        def spin(self):
            self._loop()
        '''))
    assert _summary(tools["bump_order"]) == (frozenset({"orders", "log"}), True, "update", False)
    assert _summary(tools["spin"]) == (frozenset(), False, "lookup", False)


def test_log_written_by_every_tool_is_bookkeeping():
    # BFCL's composite: every tool dispatches through a helper that appends to a call log.
    tools = analyse_environment(_env('''
        def _call(self, name, args):
            self.log.append({"name": name, "args": args})
            return name
        def list_files(self, path):
            return self._call("list_files", path)
        def delete_file(self, path):
            return self._call("delete_file", path)
        '''))
    assert _summary(tools["list_files"]) == (frozenset(), False, "lookup", False)
    assert _summary(tools["delete_file"]) == (frozenset(), True, "delete", False)  # by its verb


# --------------------------------------------------------------------------------------------
# Control tools


def test_hand_off_tool_is_control():
    tools = analyse_environment(_env('''
        def transfer_to_human_agents(self, summary):
            self.transferred = True
            self.done = True
            return "Transfer successful"
        def escalate_to_human(self, reason):
            return "escalated"
        def handoff(self):
            setattr(self, "done", None)
        '''))
    assert _summary(tools["transfer_to_human_agents"]) == (frozenset({"transferred", "done"}), False, "other", True)
    assert _summary(tools["escalate_to_human"]) == (frozenset(), False, "other", True)
    assert _summary(tools["handoff"]) == (frozenset({"done"}), False, "other", True)
    assert tools["handoff"].lookup_kind == "none"


def test_terminate_tool_is_control():
    tools = analyse_environment(_env('''
        def _finish(self):
            self.done = True
        def end_conversation(self):
            self._finish()
        def terminate_session(self):
            self.done = True
        def finish_task(self):
            return "ok"
        def done(self):
            return "###STOP###"
        '''))
    for name in ("end_conversation", "terminate_session"):
        assert _summary(tools[name]) == (frozenset({"done"}), False, "other", True), name
    for name in ("finish_task", "done"):
        assert _summary(tools[name]) == (frozenset(), False, "other", True), name


def test_hand_off_named_tool_that_writes_records_stays_state_changing():
    tools = analyse_environment(_env('''
        def transfer_to_human_agents(self, order_id):
            self.done = True
            self.orders[order_id]["escalated"] = True
        def end_session(self, user_id):
            self.done = "yes"              # not a bool/None flag
        def transfer_order(self, order_id, user_id):
            return "moved"
        '''))
    assert _summary(tools["transfer_to_human_agents"]) == (frozenset({"done", "orders"}), True, "link", False)
    assert _summary(tools["end_session"]) == (frozenset({"done"}), True, "update", False)
    # Not a control name (an order is not the conversation): judged by its verb as before.
    assert _summary(tools["transfer_order"]) == (frozenset(), True, "link", False)


def test_declared_kind_overrides_control_inference():
    methods = '''
        def transfer_to_human_agents(self, summary):
            self.done = True
        def get_user(self, user_id):
            return self.users[user_id]
        def end_conversation(self):
            self.orders.clear()
        '''
    ops = (Operation("transfer_to_human_agents", kind="state_change"), Operation("get_user", kind="query"),
           Operation("end_conversation", kind="query"))
    tools = analyse_environment(_env(methods, ops))
    assert _summary(tools["transfer_to_human_agents"]) == (frozenset({"done"}), True, "link", False)
    assert _summary(tools["get_user"]) == (frozenset(), False, "lookup", False)
    assert _summary(tools["end_conversation"]) == (frozenset({"orders"}), False, "lookup", False)
    declared_query = analyse_environment(_env(methods.replace("self.orders.clear()", "return None"), ops))
    assert _summary(declared_query["end_conversation"]) == (frozenset(), False, "other", True)


@pytest.mark.parametrize("name,expected", [
    ("transfer_to_human_agents", True), ("escalate_to_human", True), ("handoff", True),
    ("hand_off_to_agent", True), ("connectToLiveAgent", True), ("transfer_to_supervisor", True),
    ("end_conversation", True), ("terminate_session", True), ("finish_task", True), ("done", True),
    ("transfer_patient", False), ("transfer_ticket_to_agent", False), ("escalate_ticket", False),
    ("transfer", False), ("finish_job", False), ("close_ticket", False), ("find_agent_by_name", False),
    ("send_to_review", False), ("end_date_of_policy", False),
])
def test_control_names(name, expected):
    info = _info(f'''
        def {name}(self):
            return None
        ''', name)
    assert info.control is expected


# --------------------------------------------------------------------------------------------
# End to end


def test_extract_and_abstract_text_render_control_and_unpacked_writes():
    env = _env('''
        def get_order_details(self, order_id):
            if order_id not in self.orders:
                return {"success": False, "error": "unknown order"}
            return self.orders[order_id]
        def cancel_pending_order(self, order_id, reason):
            orders, users = self.orders, self.users
            order = orders.get(order_id)
            if order is None or order["status"] != "pending":
                return {"success": False, "error": "not pending"}
            order["status"] = "cancelled"
            return {"success": True}
        def transfer_to_human_agents(self, summary):
            self.done = True
            return "Transfer successful"
        ''')
    task = Task(task_id="shop-0", env_id="shop", instruction="Cancel my pending order #W1 please.",
                initial_state={"orders": {"W1": {"status": "pending"}}, "users": {}},
                checks=(Check("W1 cancelled", "def check_func(final_state):\n"
                              "    return final_state['orders']['W1']['status'] == 'cancelled'"),),
                reference_actions=(Action("get_order_details", {"order_id": "W1"}),
                                   Action("cancel_pending_order", {"order_id": "W1", "reason": "no longer needed"}),
                                   Action("transfer_to_human_agents", {"summary": "cancelled W1"})))
    ex = extract(env, task)
    assert [(op.family, op.state_changing, op.control) for op in ex.operations] == [
        ("lookup", False, False), ("delete", True, False), ("other", False, True)]
    assert ex.abstract_text() == (
        "op_lookup type_entity_by_id <string> ; "
        "op_delete type_entity_field <string> <string> dep_lookup ; "
        "op_other type_control <string> ; "
        "gate_state_precondition prov_none gate_ops_1 ; "
        "group_independent group_size_1 ; "
        "conflict_destructive delete_before_other")
    assert "transfer_to_human_agents" not in ex.abstract_text()


def test_llm_extraction_keeps_the_control_flag_whatever_family_the_model_gave():
    from envsched_jax.graph.llm_extract import to_extraction

    env = _env('''
        def transfer_to_human_agents(self, summary):
            self.transferred = True
            return "Transfer successful"
        def cancel_order(self, order_id):
            order, user = self.orders[order_id], self.users
            order["status"] = "cancelled"
        ''')
    task = Task(task_id="shop-task_0", env_id="shop", instruction="cancel then hand over",
                initial_state={}, checks=())
    item = {"task_id": task.task_id, "gates": [], "reward_groups": [], "conflicts": [],
            "operations": [
                {"id": "o0", "family": "update", "tool_candidates": ["cancel_order"], "depends_on_operations": []},
                {"id": "o1", "family": "link", "tool_candidates": ["transfer_to_human_agents"],
                 "depends_on_operations": ["o0"]}]}
    ex = to_extraction(item, env, task, analyse_environment(env))
    cancel, transfer = ex.operations
    assert (cancel.state_changing, cancel.control) == (True, False)
    assert (transfer.state_changing, transfer.control) == (False, True)
    assert "type_control" in ex.abstract_text()
