"""Fleet / vehicle rental: metadata and task builders."""

from __future__ import annotations

import copy

from envsched_jax.pool.embedded._spec import (TaskSpec, add_bystanders, absent, act, field_eq, logged, new_records,
                                              others_unchanged, reply, unchanged, where_eq)
from envsched_jax.pool.embedded.envs.fleet_rental import FleetRental

ENV_ID = "fleet_rental"
CLASS = FleetRental
SUMMARY = ("A car rental company's counter system. Vehicles belong to branches and are available, "
           "rented or in maintenance. A customer with a valid licence and no other active rental can "
           "rent an available vehicle (generated rental id); an active rental can be swapped onto "
           "another available vehicle or closed with the return mileage. Only vehicles that are not "
           "rented can change status, and only managers may retire a vehicle from the fleet.")
STATE_SPACE = (
    {"entity": "Vehicle", "attributes": "vehicle_id, model, plate, branch, status (available|rented|maintenance), mileage",
     "description": "A car in the fleet."},
    {"entity": "Customer", "attributes": "customer_id, name, phone, license_valid", "description": "A renter."},
    {"entity": "Rental", "attributes": "rental_id, vehicle_id, customer_id, status (active|closed), start_mileage, end_mileage",
     "description": "One customer renting one vehicle."},
    {"entity": "Staff", "attributes": "staff_id, name, role (agent|manager)", "description": "Counter staff."},
    {"entity": "AuditLog", "attributes": "op, actor, target", "description": "Privileged actions."},
)
CONSTRAINTS = (
    "Only available vehicles can be rented or swapped onto a rental.",
    "A customer needs a valid licence and no other active rental to rent.",
    "Closing a rental needs a mileage no lower than the start mileage; the vehicle becomes available.",
    "A rented vehicle's status cannot be changed and it cannot be retired.",
    "Only staff with role manager may retire a vehicle.",
)
TOOL_DOCS = {
    "find_customer_by_name": ("query", "Find customers by full name.", {"name": "Full name"}),
    "list_vehicles": ("query", "List the vehicles of a branch, optionally by status.",
                      {"branch": "Branch name, e.g. Downtown", "status": "Optional status filter"}),
    "list_rentals": ("query", "List rentals filtered by customer and/or status.",
                     {"customer_id": "Optional customer id", "status": "Optional status (active or closed)"}),
    "update_customer_phone": ("state_change", "Change a customer's phone number.", {"customer_id": "Customer id", "phone": "New phone"}),
    "swap_rental_vehicle": ("state_change", "Move an active rental onto another available vehicle.",
                            {"rental_id": "Rental id", "vehicle_id": "Replacement vehicle id"}),
    "create_rental": ("state_change", "Rent a vehicle to a customer; returns the rental id.",
                      {"customer_id": "Customer id", "vehicle_id": "Vehicle id"}),
    "close_rental": ("state_change", "Close an active rental with the return mileage.", {"rental_id": "Rental id", "mileage": "Odometer at return"}),
    "set_vehicle_status": ("state_change", "Set a non-rented vehicle available or in maintenance.",
                           {"vehicle_id": "Vehicle id", "status": "available or maintenance"}),
    "find_staff_by_name": ("query", "Find staff by full name; returns ids and roles.", {"name": "Full name"}),
    "retire_vehicle": ("state_change", "Remove a non-rented vehicle from the fleet (managers only).",
                       {"vehicle_id": "Vehicle id", "staff_id": "Id of the acting manager"}),
}

_BASE = {
    "vehicles": {
        "V01": {"model": "Toyota Corolla", "plate": "AB-101", "branch": "Downtown", "status": "rented", "mileage": 41500},
        "V02": {"model": "Honda Civic", "plate": "AB-102", "branch": "Downtown", "status": "available", "mileage": 38000},
        "V03": {"model": "Ford Transit", "plate": "AB-103", "branch": "Downtown", "status": "maintenance", "mileage": 91000},
        "V04": {"model": "Tesla Model 3", "plate": "AB-104", "branch": "Airport", "status": "rented", "mileage": 11800},
        "V05": {"model": "Kia Sportage", "plate": "AB-105", "branch": "Airport", "status": "available", "mileage": 27000},
        "V06": {"model": "VW Golf", "plate": "AB-106", "branch": "Airport", "status": "available", "mileage": 55000},
        "V07": {"model": "Ford Focus", "plate": "AB-107", "branch": "Downtown", "status": "maintenance", "mileage": 60000},
    },
    "customers": {
        "K001": {"name": "Ava Brooks", "phone": "555-1001", "license_valid": True},
        "K002": {"name": "Ben Carter", "phone": "555-1002", "license_valid": True},
        "K003": {"name": "Cara Diaz", "phone": "555-1003", "license_valid": False},
        "K004": {"name": "Dan Evans", "phone": "555-1004", "license_valid": True},
        "K005": {"name": "Eve Fox", "phone": "555-1005", "license_valid": True},
    },
    "rentals": {
        "RN001": {"vehicle_id": "V01", "customer_id": "K001", "status": "active", "start_mileage": 41500, "end_mileage": None},
        "RN002": {"vehicle_id": "V04", "customer_id": "K002", "status": "active", "start_mileage": 11800, "end_mileage": None},
        "RN003": {"vehicle_id": "V02", "customer_id": "K004", "status": "closed", "start_mileage": 37000, "end_mileage": 38000},
    },
    "staff": {
        "F1": {"name": "Gina Hall", "role": "manager"},
        "F2": {"name": "Hugo Ito", "role": "agent"},
        "F3": {"name": "Iris Jung", "role": "manager"},
    },
    "audit_log": [],
}
_C = {k: c["name"] for k, c in _BASE["customers"].items()}
_M = {k: v["model"] for k, v in _BASE["vehicles"].items()}
_S = {k: s["name"] for k, s in _BASE["staff"].items()}


def _state():
    return copy.deepcopy(_BASE)


def _see(vehicle_id):
    """Look a vehicle up through its branch listing."""
    return act("list_vehicles", branch=_BASE["vehicles"][vehicle_id]["branch"])


def _lookup_update():
    out = []
    for cid, phone, text in [("K001", "555-9001", "Ava Brooks has a new number: 555-9001."),
                             ("K003", "555-9003", "Please update Cara Diaz's phone to 555-9003."),
                             ("K005", "555-9005", "Eve Fox asked us to call her on 555-9005 from now on."),
                             ("K002", "555-9002", "Set Ben Carter's contact phone to 555-9002.")]:
        out.append(TaskSpec(
            text, _state(),
            [field_eq(f"{_C[cid]}'s phone is {phone}", ["customers", cid, "phone"], phone),
             unchanged("licence flag unchanged", ["customers", cid, "license_valid"]),
             others_unchanged("no other customer changed", "customers", [cid]),
             unchanged("rentals unchanged", ["rentals"])],
            [act("find_customer_by_name", name=_C[cid]), act("update_customer_phone", customer_id=cid, phone=phone),
             reply("Phone updated.")],
            "lookup_update",
            wrong=[[act("update_customer_phone", customer_id="K002", phone=phone), reply("done")]] if cid == "K001" else []))
    return out


def _reassign():
    out = []
    for rid, to, fallback in [("RN001", "V02", None), ("RN002", "V05", None), ("RN001", "V03", "V06"), ("RN002", "V07", "status")]:
        s = _state()
        r = s["rentals"][rid]
        who, old = _C[r["customer_id"]], r["vehicle_id"]
        look = [act("find_customer_by_name", name=who), act("list_rentals", customer_id=r["customer_id"], status="active"),
                _see(to)]
        if fallback is None:
            text = f"{who}'s {_M[old]} has a warning light; switch the rental to the {_M[to]} ({to})."
            checks = [field_eq(f"{rid} is on {to}", ["rentals", rid, "vehicle_id"], to),
                      field_eq(f"{to} is rented", ["vehicles", to, "status"], "rented"),
                      field_eq(f"{old} is available again", ["vehicles", old, "status"], "available")]
            out.append(TaskSpec(text, s, checks, look + [act("swap_rental_vehicle", rental_id=rid, vehicle_id=to),
                                                        reply(f"Swapped to {to}.")], "reassign_gated"))
        elif fallback == "status":
            text = (f"{who} asked to switch to the {_M[to]} ({to}). If that car is not available, leave the rental "
                    f"on the current car; the workshop says {to}'s maintenance is finished, so mark it available.")
            checks = [unchanged(f"{rid} is unchanged", ["rentals", rid]),
                      field_eq(f"{to} is available", ["vehicles", to, "status"], "available"),
                      unchanged(f"{old} stays rented", ["vehicles", old])]
            actions = look + [act("set_vehicle_status", vehicle_id=to, status="available"),
                              reply(f"{to} was in maintenance; it is now available and the rental is unchanged.")]
            out.append(TaskSpec(text, s, checks, actions, "reassign_gated", "fail",
                                wrong=[[act("set_vehicle_status", vehicle_id=to, status="available"),
                                        act("swap_rental_vehicle", rental_id=rid, vehicle_id=to), reply("done")]]))
        else:
            text = f"Swap {who}'s rental onto the {_M[to]} ({to}); if it isn't available, use the {_M[fallback]} ({fallback})."
            checks = [field_eq(f"{rid} is on {fallback}", ["rentals", rid, "vehicle_id"], fallback),
                      unchanged(f"{to} is unchanged", ["vehicles", to]),
                      field_eq(f"{old} is available again", ["vehicles", old, "status"], "available")]
            actions = look + [_see(fallback), act("swap_rental_vehicle", rental_id=rid, vehicle_id=fallback),
                              reply(f"{to} unavailable; swapped to {fallback}.")]
            out.append(TaskSpec(text, s, checks, actions, "reassign_gated", "fail"))
    return out


def _create():
    out = []
    for cid, vid, alt in [("K005", "V02", None), ("K004", "V05", None), ("K005", "V06", None), ("K003", "V05", "K004")]:
        s = _state()
        made = alt or cid
        text = f"Rent the {_M[vid]} ({vid}) to {_C[cid]}."
        if alt:
            text += f" If {_C[cid]} can't rent, put it on her co-driver {_C[alt]} instead."
        checks = [new_records(f"an active rental of {vid} for {made}", "rentals", {"vehicle_id": vid, "customer_id": made, "status": "active"}),
                  field_eq(f"{vid} is rented", ["vehicles", vid, "status"], "rented"),
                  others_unchanged("existing rentals unchanged", "rentals", [])]
        actions = [act("find_customer_by_name", name=_C[cid])] + ([act("find_customer_by_name", name=_C[alt])] if alt else [])
        actions += [_see(vid), act("create_rental", customer_id=made, vehicle_id=vid), reply("Rental created.")]
        out.append(TaskSpec(text, s, checks, actions, "create_gated", "fail" if alt else "pass",
                            wrong=[[act("create_rental", customer_id=cid, vehicle_id=vid), reply("done")]] if alt else []))
    return out


def _delete():
    out = []
    for vid, actor, boss in [("V03", "F1", None), ("V07", "F2", "F3"), ("V06", "F3", None), ("V03", "F2", "F1")]:
        if boss is None:
            text, by = f"{_S[actor]} (manager) here: retire the {_M[vid]} ({vid}) from the fleet.", actor
            actions = [act("find_staff_by_name", name=_S[actor]), _see(vid),
                       act("retire_vehicle", vehicle_id=vid, staff_id=actor)]
            wrong = []
        else:
            text = f"{_S[actor]} wants the {_M[vid]} ({vid}) retired. If agents can't do that, do it as {_S[boss]}."
            by = boss
            actions = [act("find_staff_by_name", name=_S[actor]), act("find_staff_by_name", name=_S[boss]),
                       act("retire_vehicle", vehicle_id=vid, staff_id=boss)]
            wrong = [[act("retire_vehicle", vehicle_id=vid, staff_id=actor), reply("done")]]
        checks = [absent(f"{vid} is retired", "vehicles", vid), logged(f"retired by {by}", "retire_vehicle", by, vid),
                  others_unchanged("no other vehicle changed", "vehicles", [vid])]
        out.append(TaskSpec(text, _state(), checks, actions + [reply(f"{vid} retired.")],
                            "authorized_delete", "pass" if boss is None else "fail", wrong=wrong))
    return out


def _multi_step():
    out = []
    for rid, km, nxt in [("RN001", 42350, "V02"), ("RN002", 12400, "V06"), ("RN001", 41900, "V05"), ("RN002", 13020, "V02")]:
        s = _state()
        r = s["rentals"][rid]
        cid, old = r["customer_id"], r["vehicle_id"]
        text = (f"{_C[cid]} is returning the {_M[old]} with {km} km on the clock. Close the rental, send the car to "
                f"maintenance, and rent {_C[cid]} the {_M[nxt]} ({nxt}) for the next trip.")
        checks = [field_eq(f"{rid} is closed at {km}", ["rentals", rid, "end_mileage"], km),
                  field_eq(f"{old} is in maintenance", ["vehicles", old, "status"], "maintenance"),
                  new_records(f"a new rental of {nxt} for {cid}", "rentals", {"vehicle_id": nxt, "customer_id": cid, "status": "active"})]
        actions = [act("find_customer_by_name", name=_C[cid]), act("list_rentals", customer_id=cid, status="active"),
                   act("close_rental", rental_id=rid, mileage=km), act("set_vehicle_status", vehicle_id=old, status="maintenance"),
                   _see(nxt), act("create_rental", customer_id=cid, vehicle_id=nxt), reply("Done.")]
        out.append(TaskSpec(text, s, checks, actions, "multi_step",
                            wrong=[[act("create_rental", customer_id=cid, vehicle_id=nxt), reply("done")]]))
    return out


def _bulk():
    out = []
    for branch, frm, to in [("Downtown", "maintenance", "available"), ("Airport", "available", "maintenance"),
                            ("Downtown", "available", "maintenance"), ("Airport", "maintenance", "available")]:
        s = _state()
        if branch == "Airport" and frm == "maintenance":
            s["vehicles"]["V08"] = {"model": "Mini Cooper", "plate": "AB-108", "branch": "Airport", "status": "maintenance", "mileage": 8000}
            s["vehicles"]["V09"] = {"model": "Audi A4", "plate": "AB-109", "branch": "Airport", "status": "maintenance", "mileage": 15000}
        ids = [k for k, v in s["vehicles"].items() if v["branch"] == branch and v["status"] == frm]
        text = f"Set every {frm} vehicle at the {branch} branch to {to}."
        checks = [where_eq(f"all {frm} vehicles at {branch} are {to}", "vehicles", {"branch": branch, "status": frm}, "status", to),
                  others_unchanged("no other vehicle changed", "vehicles", ids), unchanged("rentals unchanged", ["rentals"])]
        actions = [act("list_vehicles", branch=branch, status=frm)] + [act("set_vehicle_status", vehicle_id=k, status=to) for k in ids]
        out.append(TaskSpec(text, s, checks, actions + [reply(f"Updated {', '.join(ids)}.")], "filter_bulk_update"))
    return out


def build_tasks() -> list[TaskSpec]:
    tasks = _lookup_update() + _reassign() + _create() + _delete() + _multi_step() + _bulk()
    return add_bystanders(tasks, "customers", "K", lambda name, k: {"name": name, "phone": f"555-7{k:03d}", "license_valid": k % 2 == 0})
