"""Warehouse inventory: metadata and task builders."""

from __future__ import annotations

import copy

from envsched_jax.pool.embedded._spec import (TaskSpec, add_bystanders, absent, act, field_eq, logged, new_records,
                                              others_unchanged, reply, unchanged, where_eq)
from envsched_jax.pool.embedded.envs.warehouse_inventory import WarehouseInventory

ENV_ID = "warehouse_inventory"
CLASS = WarehouseInventory
SUMMARY = ("A distribution warehouse. Each product's stock sits in one bin of a zone; a product can "
           "move only into an empty bin with enough capacity. Creating an order reserves stock of an "
           "active product and gets a generated order id; open orders can be shipped. Only managers "
           "(not pickers) may delete an open order, which puts its quantity back into stock.")
STATE_SPACE = (
    {"entity": "Product", "attributes": "sku, name, bin_id, quantity, status (active|discontinued)",
     "description": "A stocked item and its on-hand quantity."},
    {"entity": "Bin", "attributes": "bin_id, zone, capacity, sku", "description": "A storage location holding at most one product."},
    {"entity": "Order", "attributes": "order_id, sku, quantity, status (open|shipped)", "description": "An outbound order."},
    {"entity": "Staff", "attributes": "staff_id, name, role (picker|manager)", "description": "Warehouse employees."},
    {"entity": "AuditLog", "attributes": "op, actor, target", "description": "Privileged actions."},
)
CONSTRAINTS = (
    "A product can move only into an empty bin whose capacity is at least the product's quantity.",
    "A stock level may not exceed the capacity of the product's bin.",
    "Orders can be created only for active products with enough stock; creation deducts the stock.",
    "Only open orders can be shipped or deleted.",
    "Only staff with role manager can delete an order; deletion restocks its quantity.",
)
TOOL_DOCS = {
    "find_product_by_name": ("query", "Find products by exact name; returns skus and records.", {"name": "Product name"}),
    "get_bin": ("query", "Get one bin by id.", {"bin_id": "Bin id, e.g. A-01"}),
    "list_bins": ("query", "List the bins of a zone, optionally only empty ones.",
                  {"zone": "Zone letter, e.g. A", "empty_only": "Only bins holding no product"}),
    "list_orders": ("query", "List orders, optionally filtered by sku and status.",
                    {"sku": "Optional sku", "status": "Optional status (open or shipped)"}),
    "set_stock_level": ("state_change", "Record the counted on-hand quantity of a product.",
                        {"sku": "Product sku", "quantity": "Counted quantity"}),
    "move_product": ("state_change", "Move a product into an empty bin that can hold it.",
                     {"sku": "Product sku", "bin_id": "Target bin id"}),
    "create_order": ("state_change", "Create an open order reserving stock; returns the order id.",
                     {"sku": "Product sku", "quantity": "Units to order"}),
    "ship_order": ("state_change", "Mark an open order as shipped.", {"order_id": "Order id"}),
    "find_staff_by_name": ("query", "Find staff by full name; returns ids and roles.", {"name": "Staff member's full name"}),
    "delete_order": ("state_change", "Delete an open order and restock it (managers only).",
                     {"order_id": "Order id", "staff_id": "Id of the acting manager"}),
}

_BASE = {
    "products": {
        "SKU-100": {"name": "Steel Bolts M8", "bin_id": "A-01", "quantity": 60, "status": "active"},
        "SKU-101": {"name": "Copper Wire 2mm", "bin_id": "A-02", "quantity": 45, "status": "active"},
        "SKU-102": {"name": "Pallet Wrap", "bin_id": "B-01", "quantity": 150, "status": "active"},
        "SKU-103": {"name": "Safety Gloves", "bin_id": "B-03", "quantity": 0, "status": "active"},
        "SKU-104": {"name": "Cable Ties", "bin_id": "C-01", "quantity": 25, "status": "discontinued"},
    },
    "bins": {
        "A-01": {"zone": "A", "capacity": 100, "sku": "SKU-100"},
        "A-02": {"zone": "A", "capacity": 50, "sku": "SKU-101"},
        "A-03": {"zone": "A", "capacity": 80, "sku": None},
        "B-01": {"zone": "B", "capacity": 200, "sku": "SKU-102"},
        "B-02": {"zone": "B", "capacity": 40, "sku": None},
        "B-03": {"zone": "B", "capacity": 150, "sku": "SKU-103"},
        "C-01": {"zone": "C", "capacity": 30, "sku": "SKU-104"},
        "C-02": {"zone": "C", "capacity": 120, "sku": None},
        "C-03": {"zone": "C", "capacity": 60, "sku": None},
    },
    "orders": {
        "O001": {"sku": "SKU-100", "quantity": 10, "status": "open"},
        "O002": {"sku": "SKU-102", "quantity": 30, "status": "open"},
        "O003": {"sku": "SKU-101", "quantity": 5, "status": "shipped"},
        "O004": {"sku": "SKU-100", "quantity": 20, "status": "open"},
        "O005": {"sku": "SKU-102", "quantity": 15, "status": "shipped"},
    },
    "staff": {
        "W1": {"name": "Ana Torres", "role": "manager"},
        "W2": {"name": "Luis Gomez", "role": "picker"},
        "W3": {"name": "Mei Tan", "role": "manager"},
    },
    "audit_log": [],
}
_NAMES = {k: p["name"] for k, p in _BASE["products"].items()}


def _state():
    return copy.deepcopy(_BASE)


def _lookup_update():
    out = []
    for sku, qty, text in [
        ("SKU-100", 58, "Cycle count done: we have 58 Steel Bolts M8 on hand. Fix the stock level."),
        ("SKU-103", 40, "40 Safety Gloves were found during the audit; set their stock to 40."),
        ("SKU-102", 140, "Correct the Pallet Wrap quantity to 140 units."),
        ("SKU-101", 44, "One spool of Copper Wire 2mm was damaged; stock should read 44 now."),
    ]:
        name = _NAMES[sku]
        out.append(TaskSpec(
            text, _state(),
            [field_eq(f"{name} quantity is {qty}", ["products", sku, "quantity"], qty),
             unchanged(f"{name} stays in its bin", ["products", sku, "bin_id"]),
             others_unchanged("no other product changed", "products", [sku]),
             unchanged("orders are unchanged", ["orders"])],
            [act("find_product_by_name", name=name), act("set_stock_level", sku=sku, quantity=qty),
             reply(f"{name} stock set to {qty}.")],
            "lookup_update",
            wrong=[[act("set_stock_level", sku="SKU-101", quantity=qty), reply("done")]] if sku == "SKU-100" else []))
    return out


def _reassign():
    out = []
    for sku, target, fallback in [("SKU-101", "A-03", None), ("SKU-100", "C-02", None),
                                  ("SKU-100", "B-02", "C-03"), ("SKU-102", "C-02", "SKU-104")]:
        s = _state()
        name, old = _NAMES[sku], s["products"][sku]["bin_id"]
        look = [act("find_product_by_name", name=name), act("get_bin", bin_id=target)]
        if fallback is None:
            text = f"Relocate {name} to bin {target}."
            checks = [field_eq(f"{name} is in {target}", ["products", sku, "bin_id"], target),
                      field_eq(f"{target} holds {sku}", ["bins", target, "sku"], sku),
                      field_eq(f"{old} is empty", ["bins", old, "sku"], None)]
            out.append(TaskSpec(text, s, checks, look + [act("move_product", sku=sku, bin_id=target),
                                                        reply(f"{name} moved to {target}.")], "reassign_gated"))
        elif fallback.startswith("SKU"):
            other = _NAMES[fallback]
            text = (f"Try to move {name} into {target}. If it does not fit, leave it where it is and put the "
                    f"{other} into {target} instead.")
            checks = [unchanged(f"{name} is not moved", ["products", sku]),
                      field_eq(f"{other} is in {target}", ["products", fallback, "bin_id"], target),
                      field_eq(f"{target} holds {fallback}", ["bins", target, "sku"], fallback),
                      field_eq(f"{s['products'][fallback]['bin_id']} is empty", ["bins", s["products"][fallback]["bin_id"], "sku"], None)]
            actions = look + [act("find_product_by_name", name=other), act("move_product", sku=fallback, bin_id=target),
                              reply(f"{name} does not fit in {target}; moved {other} there.")]
            out.append(TaskSpec(text, s, checks, actions, "reassign_gated", "fail",
                                wrong=[[act("move_product", sku=sku, bin_id=target), reply("done")]]))
        else:
            text = f"Move the {name} to bin {target}, or to {fallback} if {target} is too small."
            checks = [field_eq(f"{name} is in {fallback}", ["products", sku, "bin_id"], fallback),
                      unchanged(f"{target} is unchanged", ["bins", target]),
                      field_eq(f"{old} is empty", ["bins", old, "sku"], None)]
            actions = look + [act("move_product", sku=sku, bin_id=fallback), reply(f"{target} too small; used {fallback}.")]
            out.append(TaskSpec(text, s, checks, actions, "reassign_gated", "fail"))
    return out


def _create():
    out = []
    for sku, qty, alt, text in [
        ("SKU-100", 20, None, "Create an order for 20 Steel Bolts M8."),
        ("SKU-101", 40, None, "A customer needs 40 units of Copper Wire 2mm; place the order."),
        ("SKU-102", 25, None, "Book an outbound order of 25 Pallet Wrap."),
        ("SKU-103", 10, "SKU-100", "Order 10 Safety Gloves. If there isn't enough stock, order 10 Steel Bolts M8 instead."),
    ]:
        s = _state()
        made = alt or sku
        checks = [new_records(f"a new open order of {qty} {made}", "orders", {"sku": made, "quantity": qty, "status": "open"}),
                  field_eq(f"{made} stock reduced by {qty}", ["products", made, "quantity"], s["products"][made]["quantity"] - qty),
                  others_unchanged("existing orders unchanged", "orders", [])]
        actions = [act("find_product_by_name", name=_NAMES[sku])]
        if alt:
            checks.append(unchanged(f"{_NAMES[sku]} is unchanged", ["products", sku]))
            actions.append(act("find_product_by_name", name=_NAMES[alt]))
        actions += [act("create_order", sku=made, quantity=qty), reply(f"Order placed for {qty} {_NAMES[made]}.")]
        out.append(TaskSpec(text, s, checks, actions, "create_gated", "fail" if alt else "pass"))
    return out


def _delete():
    out = []
    for oid, actor, actor_id, boss in [("O001", "Ana Torres", "W1", None), ("O004", "Luis Gomez", "W2", ("Mei Tan", "W3")),
                                       ("O002", "Mei Tan", "W3", None), ("O002", "Luis Gomez", "W2", ("Ana Torres", "W1"))]:
        s = _state()
        sku, qty = s["orders"][oid]["sku"], s["orders"][oid]["quantity"]
        if boss is None:
            text, by = f"{actor} here. Please delete open order {oid}; the customer withdrew it.", actor_id
            actions = [act("find_staff_by_name", name=actor), act("delete_order", order_id=oid, staff_id=by)]
            wrong = []
        else:
            text = f"{actor} asks to delete order {oid}. If his role doesn't allow it, do it on {boss[0]}'s authority."
            by = boss[1]
            actions = [act("find_staff_by_name", name=actor), act("find_staff_by_name", name=boss[0]),
                       act("delete_order", order_id=oid, staff_id=by)]
            wrong = [[act("delete_order", order_id=oid, staff_id=actor_id), reply("done")]]
        checks = [absent(f"order {oid} is deleted", "orders", oid),
                  logged(f"deleted by {by}", "delete_order", by, oid),
                  field_eq(f"{qty} units returned to {sku}", ["products", sku, "quantity"], s["products"][sku]["quantity"] + qty)]
        out.append(TaskSpec(text, s, checks, actions + [reply(f"Order {oid} deleted.")],
                            "authorized_delete", "pass" if boss is None else "fail", wrong=wrong))
    return out


def _multi_step():
    out = []
    for sku, received, qty in [("SKU-103", 50, 30), ("SKU-101", 5, 48), ("SKU-100", 40, 90), ("SKU-102", 50, 180)]:
        s = _state()
        name, level = _NAMES[sku], s["products"][sku]["quantity"] + received
        text = (f"A delivery of {received} {name} just arrived. Book it into stock, then create an order for "
                f"{qty} of them and ship it right away.")
        checks = [field_eq(f"{name} stock is {level - qty}", ["products", sku, "quantity"], level - qty),
                  new_records(f"a shipped order of {qty} {name}", "orders", {"sku": sku, "quantity": qty, "status": "shipped"}),
                  others_unchanged("existing orders unchanged", "orders", [])]
        actions = [act("find_product_by_name", name=name), act("set_stock_level", sku=sku, quantity=level),
                   act("create_order", sku=sku, quantity=qty), act("ship_order", order_id="O006"),
                   reply("Stock updated and order O006 shipped.")]
        out.append(TaskSpec(text, s, checks, actions, "multi_step",
                            wrong=[[act("create_order", sku=sku, quantity=qty), act("ship_order", order_id="O006"), reply("done")]]))
    return out


def _bulk():
    out = []
    for sku, text in [("SKU-100", "Ship every open order of Steel Bolts M8."),
                      ("SKU-102", "The Pallet Wrap truck is here: ship all open Pallet Wrap orders."),
                      ("", "End of day: ship every open order in the system."),
                      ("SKU-101", "Ship all pending orders for Copper Wire 2mm.")]:
        s = _state()
        s["orders"]["O006"] = {"sku": sku or "SKU-101", "quantity": 4, "status": "open"}
        if sku == "SKU-101":
            s["orders"]["O007"] = {"sku": "SKU-101", "quantity": 6, "status": "open"}
        ids = [k for k, o in s["orders"].items() if o["status"] == "open" and (not sku or o["sku"] == sku)]
        match = {"status": "open", **({"sku": sku} if sku else {})}
        checks = [where_eq("every matching open order is shipped", "orders", match, "status", "shipped"),
                  others_unchanged("no other order changed", "orders", ids),
                  unchanged("products are unchanged", ["products"])]
        actions = ([act("find_product_by_name", name=_NAMES[sku])] if sku else []) + [act("list_orders", sku=sku, status="open")]
        actions += [act("ship_order", order_id=k) for k in ids]
        out.append(TaskSpec(text, s, checks, actions + [reply(f"Shipped {', '.join(ids)}.")], "filter_bulk_update"))
    return out


def build_tasks() -> list[TaskSpec]:
    tasks = _lookup_update() + _reassign() + _create() + _delete() + _multi_step() + _bulk()
    return add_bystanders(tasks, "staff", "W", lambda name, k: {"name": name, "role": "picker"})
