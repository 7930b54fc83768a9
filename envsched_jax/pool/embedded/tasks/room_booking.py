"""Conference room booking: metadata and task builders."""

from __future__ import annotations

import copy

from envsched_jax.pool.embedded._spec import (TaskSpec, add_bystanders, absent, act, all_absent, field_eq, logged, new_records,
                                              others_unchanged, reply, unchanged)
from envsched_jax.pool.embedded.envs.room_booking import ConferenceRoomBooking

ENV_ID = "room_booking"
CLASS = ConferenceRoomBooking
SUMMARY = ("An office's conference room booking system. Rooms on several floors have a seat capacity "
           "and may be out of service; a booking reserves one room for one time slot for a number of "
           "attendees. Creating or moving a booking requires an available room with enough seats that "
           "is free in that slot; new bookings get generated ids. A booking can be cancelled by its "
           "owner or by facilities staff, and only facilities may change a room's status.")
STATE_SPACE = (
    {"entity": "Room", "attributes": "room_id, name, floor, capacity, status (available|out_of_service)",
     "description": "A bookable meeting room."},
    {"entity": "Booking", "attributes": "booking_id, room_id, employee_id, slot, attendees, title",
     "description": "A room reserved for one slot."},
    {"entity": "Employee", "attributes": "employee_id, name, email, role (employee|facilities)",
     "description": "Staff who book rooms."},
    {"entity": "AuditLog", "attributes": "op, actor, target", "description": "Privileged actions."},
)
CONSTRAINTS = (
    "A room can hold at most one booking per slot.",
    "A booking's attendees may not exceed the room's capacity.",
    "Only available rooms can be booked or receive a moved booking.",
    "A booking can be cancelled only by its owner or by an employee with role facilities.",
    "Only facilities can change a room's status, and a room with bookings cannot go out of service.",
)
TOOL_DOCS = {
    "find_employee_by_name": ("query", "Find employees by full name; returns ids, emails and roles.", {"name": "Full name"}),
    "find_room_by_name": ("query", "Find a room by its name.", {"name": "Room name, e.g. Aurora"}),
    "list_rooms": ("query", "List the rooms of a floor, optionally with a minimum capacity.",
                   {"floor": "Floor number", "min_capacity": "Minimum number of seats"}),
    "list_bookings": ("query", "List bookings, optionally filtered by room and slot.",
                      {"room_id": "Optional room id", "slot": "Optional slot, e.g. 2025-03-10T09:00"}),
    "update_employee_email": ("state_change", "Change an employee's email.", {"employee_id": "Employee id", "email": "New email"}),
    "move_booking": ("state_change", "Move a booking to another room in the same slot.",
                     {"booking_id": "Booking id", "room_id": "Target room id"}),
    "create_booking": ("state_change", "Book a room for a slot; returns the booking id.",
                       {"employee_id": "Owner's employee id", "room_id": "Room id", "slot": "Slot, e.g. 2025-03-10T09:00",
                        "attendees": "Number of attendees", "title": "Optional meeting title"}),
    "cancel_booking": ("state_change", "Cancel (delete) a booking as its owner or as facilities staff.",
                       {"booking_id": "Booking id", "employee_id": "Id of the employee cancelling"}),
    "set_room_status": ("state_change", "Set a room available or out of service (facilities only).",
                        {"room_id": "Room id", "status": "available or out_of_service", "employee_id": "Id of the acting facilities employee"}),
}

MON9, MON11, MON14 = "2025-03-10T09:00", "2025-03-10T11:00", "2025-03-10T14:00"
_BASE = {
    "rooms": {
        "R1": {"name": "Aurora", "floor": 2, "capacity": 8, "status": "available"},
        "R2": {"name": "Borealis", "floor": 2, "capacity": 4, "status": "available"},
        "R3": {"name": "Cosmos", "floor": 3, "capacity": 12, "status": "available"},
        "R4": {"name": "Delta", "floor": 3, "capacity": 6, "status": "available"},
        "R5": {"name": "Echo", "floor": 4, "capacity": 20, "status": "available"},
        "R6": {"name": "Fjord", "floor": 4, "capacity": 12, "status": "out_of_service"},
    },
    "bookings": {
        "BK001": {"room_id": "R1", "employee_id": "E01", "slot": MON9, "attendees": 6, "title": "Design review"},
        "BK002": {"room_id": "R3", "employee_id": "E02", "slot": MON9, "attendees": 10, "title": "All hands"},
        "BK003": {"room_id": "R2", "employee_id": "E04", "slot": MON11, "attendees": 3, "title": "Interview"},
        "BK004": {"room_id": "R4", "employee_id": "E01", "slot": MON14, "attendees": 5, "title": "Sprint planning"},
        "BK005": {"room_id": "R5", "employee_id": "E02", "slot": "2025-03-11T10:00", "attendees": 18, "title": "Workshop"},
    },
    "employees": {
        "E01": {"name": "Nadia Bell", "email": "nadia@corp.test", "role": "employee"},
        "E02": {"name": "Owen Clarke", "email": "owen@corp.test", "role": "employee"},
        "E03": {"name": "Priya Nair", "email": "priya@corp.test", "role": "facilities"},
        "E04": {"name": "Quentin Moss", "email": "quentin@corp.test", "role": "employee"},
        "E05": {"name": "Rita Sousa", "email": "rita@corp.test", "role": "facilities"},
    },
    "audit_log": [],
}
_EMP = {k: e["name"] for k, e in _BASE["employees"].items()}
_ROOM = {k: r["name"] for k, r in _BASE["rooms"].items()}


def _state():
    return copy.deepcopy(_BASE)


def _lookup_update():
    out = []
    for eid, email, text in [
        ("E01", "n.bell@corp.test", "Nadia Bell's address changed to n.bell@corp.test; update her profile."),
        ("E04", "qmoss@corp.test", "Please set Quentin Moss's email to qmoss@corp.test."),
        ("E02", "owen.clarke@corp.test", "Owen Clarke should receive invites at owen.clarke@corp.test from now on."),
        ("E05", "rita.sousa@corp.test", "Update the email of Rita Sousa to rita.sousa@corp.test."),
    ]:
        name = _EMP[eid]
        out.append(TaskSpec(
            text, _state(),
            [field_eq(f"{name}'s email is {email}", ["employees", eid, "email"], email),
             unchanged(f"{name}'s role is unchanged", ["employees", eid, "role"]),
             others_unchanged("no other employee changed", "employees", [eid]),
             unchanged("bookings are unchanged", ["bookings"])],
            [act("find_employee_by_name", name=name), act("update_employee_email", employee_id=eid, email=email),
             reply(f"{name}'s email is now {email}.")],
            "lookup_update",
            wrong=[[act("update_employee_email", employee_id="E02", email=email), reply("done")]] if eid == "E01" else []))
    return out


def _reassign():
    out = []
    for bid, target, fallback in [("BK003", "R1", None), ("BK004", "R3", None), ("BK001", "R2", "R4"), ("BK002", "R6", "status")]:
        s = _state()
        b = s["bookings"][bid]
        who, title = _EMP[b["employee_id"]], b["title"]
        look = [act("find_employee_by_name", name=who), act("list_bookings"),
                act("find_room_by_name", name=_ROOM[target])]
        if fallback is None:
            text = f"{who}'s '{title}' meeting needs to move to {_ROOM[target]}, same time."
            checks = [field_eq(f"'{title}' is in {_ROOM[target]}", ["bookings", bid, "room_id"], target),
                      unchanged("its slot is unchanged", ["bookings", bid, "slot"]),
                      others_unchanged("no other booking changed", "bookings", [bid])]
            out.append(TaskSpec(text, s, checks, look + [act("move_booking", booking_id=bid, room_id=target),
                                                        reply(f"Moved to {_ROOM[target]}.")], "reassign_gated"))
        elif fallback == "status":
            text = (f"Move {who}'s '{title}' to {_ROOM[target]}. If that room is not available, keep the meeting where "
                    f"it is and ask Rita Sousa (facilities) to put {_ROOM[target]} back in service.")
            checks = [unchanged(f"'{title}' is not moved", ["bookings", bid]),
                      field_eq(f"{_ROOM[target]} is available", ["rooms", target, "status"], "available"),
                      logged("Rita Sousa changed the room status", "set_room_status", "E05", target)]
            actions = look + [act("find_employee_by_name", name="Rita Sousa"),
                              act("set_room_status", room_id=target, status="available", employee_id="E05"),
                              reply(f"{_ROOM[target]} was out of service; it is available again, the meeting stays.")]
            out.append(TaskSpec(text, s, checks, actions, "reassign_gated", "fail"))
        else:
            text = (f"Please put {who}'s '{title}' into {_ROOM[target]}; if it doesn't seat everyone, "
                    f"use {_ROOM[fallback]} instead.")
            checks = [field_eq(f"'{title}' is in {_ROOM[fallback]}", ["bookings", bid, "room_id"], fallback),
                      unchanged("its slot is unchanged", ["bookings", bid, "slot"]),
                      others_unchanged("no other booking changed", "bookings", [bid])]
            actions = look + [act("find_room_by_name", name=_ROOM[fallback]), act("move_booking", booking_id=bid, room_id=fallback),
                              reply(f"{_ROOM[target]} is too small; moved to {_ROOM[fallback]}.")]
            out.append(TaskSpec(text, s, checks, actions, "reassign_gated", "fail",
                                wrong=[[act("move_booking", booking_id=bid, room_id=target), reply("done")]]))
    return out


def _create():
    out = []
    for eid, room, slot, n, alt in [("E04", "R2", MON14, 4, None), ("E01", "R5", "2025-03-10T13:00", 15, None),
                                    ("E02", "R4", "2025-03-11T09:00", 6, None), ("E03", "R1", MON9, 6, "R4")]:
        s = _state()
        who, made = _EMP[eid], alt or room
        text = f"Book {_ROOM[room]} for {who} at {slot} for {n} people, titled 'Sync'."
        if alt:
            text += f" If it is already taken, book {_ROOM[alt]} instead."
        checks = [new_records(f"a booking of {_ROOM[made]} for {who} at {slot}", "bookings",
                              {"room_id": made, "employee_id": eid, "slot": slot, "attendees": n}),
                  others_unchanged("existing bookings unchanged", "bookings", []),
                  unchanged("rooms are unchanged", ["rooms"])]
        actions = [act("find_employee_by_name", name=who), act("find_room_by_name", name=_ROOM[room]),
                   act("list_bookings", room_id=room, slot=slot)]
        if alt:
            actions += [act("find_room_by_name", name=_ROOM[alt]), act("list_bookings", room_id=alt, slot=slot)]
        actions += [act("create_booking", employee_id=eid, room_id=made, slot=slot, attendees=n, title="Sync"),
                    reply(f"Booked {_ROOM[made]}.")]
        out.append(TaskSpec(text, s, checks, actions, "create_gated", "fail" if alt else "pass"))
    return out


def _delete():
    out = []
    for bid, actor, boss in [("BK001", "E01", None), ("BK002", "E04", "E03"), ("BK003", "E05", None), ("BK004", "E02", "E05")]:
        s = _state()
        b = s["bookings"][bid]
        owner, title = _EMP[b["employee_id"]], b["title"]
        if boss is None:
            text = (f"I'm {_EMP[actor]}. Cancel the '{title}' booking" +
                    (" I made." if actor == b["employee_id"] else f" that {owner} made; facilities is freeing the room."))
            by = actor
            actions = [act("find_employee_by_name", name=_EMP[actor]), act("list_bookings"),
                       act("cancel_booking", booking_id=bid, employee_id=actor)]
            wrong = []
        else:
            text = (f"{_EMP[actor]} wants {owner}'s '{title}' booking cancelled. If {_EMP[actor]} may not cancel it, "
                    f"have {_EMP[boss]} from facilities do it.")
            by = boss
            actions = [act("find_employee_by_name", name=_EMP[actor]), act("find_employee_by_name", name=_EMP[boss]),
                       act("list_bookings"), act("cancel_booking", booking_id=bid, employee_id=boss)]
            wrong = [[act("cancel_booking", booking_id=bid, employee_id=actor), reply("done")]]
        checks = [absent(f"'{title}' is cancelled", "bookings", bid),
                  logged(f"cancelled by {by}", "cancel_booking", by, bid),
                  others_unchanged("no other booking changed", "bookings", [bid])]
        out.append(TaskSpec(text, s, checks, actions + [reply(f"'{title}' cancelled.")],
                            "authorized_delete", "pass" if boss is None else "fail", wrong=wrong))
    return out


def _multi_step():
    out = []
    for bid, new_slot, room in [("BK004", "2025-03-11T14:00", "R3"), ("BK003", "2025-03-10T15:00", "R2"),
                                ("BK001", "2025-03-12T09:00", "R1"), ("BK002", MON14, "R5")]:
        s = _state()
        b = s["bookings"][bid]
        eid, who, title = b["employee_id"], _EMP[b["employee_id"]], b["title"]
        text = (f"{who} needs to reschedule '{title}' to {new_slot} in {_ROOM[room]}. Cancel the old booking on "
                f"their behalf and book the new slot for the same number of people.")
        checks = [absent("the old booking is gone", "bookings", bid),
                  new_records(f"a new '{title}' booking at {new_slot}", "bookings",
                              {"room_id": room, "employee_id": eid, "slot": new_slot, "attendees": b["attendees"]}),
                  logged(f"{who} cancelled the old booking", "cancel_booking", eid, bid)]
        actions = [act("find_employee_by_name", name=who), act("list_bookings"), act("find_room_by_name", name=_ROOM[room]),
                   act("list_bookings", room_id=room, slot=new_slot), act("cancel_booking", booking_id=bid, employee_id=eid),
                   act("create_booking", employee_id=eid, room_id=room, slot=new_slot, attendees=b["attendees"], title=title),
                   reply(f"'{title}' moved to {new_slot}.")]
        out.append(TaskSpec(text, s, checks, actions, "multi_step",
                            wrong=[[act("create_booking", employee_id=eid, room_id=room, slot=new_slot,
                                        attendees=b["attendees"], title=title), reply("done")]]))
    return out


def _bulk():
    out = []
    for key, value, text in [("room_id", "R1", "Aurora is being repainted. As Priya Nair from facilities, cancel all of its bookings."),
                             ("slot", MON9, "Fire drill at 2025-03-10T09:00: Priya Nair (facilities) asks to cancel every booking in that slot."),
                             ("room_id", "R5", "Priya Nair needs Echo cleared: cancel every Echo booking."),
                             ("room_id", "R4", "Acting as facilities (Priya Nair), drop all bookings of Delta.")]:
        s = _state()
        s["bookings"]["BK006"] = {"room_id": "R1" if value != "R4" else "R4", "employee_id": "E04",
                                  "slot": "2025-03-12T16:00", "attendees": 2, "title": "Catch-up"}
        ids = [k for k, b in s["bookings"].items() if b[key] == value]
        checks = [all_absent(f"bookings {', '.join(ids)} are cancelled", "bookings", ids), others_unchanged("no other booking changed", "bookings", ids),
                  logged("facilities cancelled them", "cancel_booking", "E03", ids[0])]
        actions = [act("find_employee_by_name", name="Priya Nair")]
        actions += [act("find_room_by_name", name=_ROOM[value]), act("list_bookings", room_id=value)] if key == "room_id" \
            else [act("list_bookings", slot=value)]
        actions += [act("cancel_booking", booking_id=k, employee_id="E03") for k in ids]
        out.append(TaskSpec(text, s, checks, actions + [reply(f"Cancelled {', '.join(ids)}.")], "filter_bulk_update"))
    return out


def build_tasks() -> list[TaskSpec]:
    tasks = _lookup_update() + _reassign() + _create() + _delete() + _multi_step() + _bulk()
    return add_bystanders(tasks, "employees", "E", lambda name, k: {"name": name, "email": f"staff{k}@corp.test", "role": "employee"})
