"""Conference room booking: rooms, time-slot bookings and employees."""


def _ok(data=None):
    return {"success": True, "data": data}


def _err(message):
    return {"success": False, "error": message}


def _bad_str(**values):
    for name, value in values.items():
        if not isinstance(value, str) or not value.strip():
            return _err(f"{name} must be a non-empty string")
    return None


def _new_id(table, prefix, width=3):
    n = max([int(k[len(prefix):]) for k in table if k.startswith(prefix) and k[len(prefix):].isdigit()] or [0])
    return f"{prefix}{n + 1:0{width}d}"


class ConferenceRoomBooking:
    def __init__(self, init_config):
        cfg = init_config or {}
        self.rooms = cfg.get("rooms", {})          # R1 -> {name, floor, capacity, status}
        self.bookings = cfg.get("bookings", {})    # BK001 -> {room_id, employee_id, slot, attendees, title}
        self.employees = cfg.get("employees", {})  # E01 -> {name, email, role}
        self.audit_log = cfg.get("audit_log", [])  # [{op, actor, target}]

    def _room_problem(self, room_id, slot, attendees, ignore=None):
        room = self.rooms.get(room_id)
        if room is None:
            return f"unknown room {room_id!r}"
        if room["status"] != "available":
            return f"room {room['name']} is {room['status']}"
        if attendees > room["capacity"]:
            return f"room {room['name']} seats only {room['capacity']}"
        if any(b["room_id"] == room_id and b["slot"] == slot for k, b in self.bookings.items() if k != ignore):
            return f"room {room['name']} is already booked at {slot}"
        return None

    def find_employee_by_name(self, name: str):
        if bad := _bad_str(name=name):
            return bad
        hits = [{"employee_id": k, **e} for k, e in self.employees.items() if e["name"].lower() == name.strip().lower()]
        return _ok(hits) if hits else _err(f"no employee named {name!r}")

    def find_room_by_name(self, name: str):
        if bad := _bad_str(name=name):
            return bad
        hits = [{"room_id": k, **r} for k, r in self.rooms.items() if r["name"].lower() == name.strip().lower()]
        return _ok(hits) if hits else _err(f"no room named {name!r}")

    def list_rooms(self, floor: int, min_capacity: int = 0):
        if not isinstance(floor, int) or not isinstance(min_capacity, int):
            return _err("floor and min_capacity must be integers")
        return _ok([{"room_id": k, **r} for k, r in self.rooms.items()
                    if r["floor"] == floor and r["capacity"] >= min_capacity])

    def list_bookings(self, room_id: str = "", slot: str = ""):
        if not isinstance(room_id, str) or not isinstance(slot, str):
            return _err("filters must be strings")
        return _ok([{"booking_id": k, **b} for k, b in self.bookings.items()
                    if (not room_id or b["room_id"] == room_id) and (not slot or b["slot"] == slot)])

    def update_employee_email(self, employee_id: str, email: str):
        if bad := _bad_str(employee_id=employee_id, email=email):
            return bad
        if employee_id not in self.employees:
            return _err(f"unknown employee {employee_id!r}")
        if "@" not in email:
            return _err("invalid email address")
        self.employees[employee_id]["email"] = email
        return _ok({"employee_id": employee_id, "email": email})

    def move_booking(self, booking_id: str, room_id: str):
        """Move a booking to another room that is available, large enough and free in its slot."""
        if bad := _bad_str(booking_id=booking_id, room_id=room_id):
            return bad
        booking = self.bookings.get(booking_id)
        if booking is None:
            return _err(f"unknown booking {booking_id!r}")
        if problem := self._room_problem(room_id, booking["slot"], booking["attendees"], ignore=booking_id):
            return _err(problem)
        booking["room_id"] = room_id
        return _ok({"booking_id": booking_id, "room_id": room_id})

    def create_booking(self, employee_id: str, room_id: str, slot: str, attendees: int, title: str = ""):
        if bad := _bad_str(employee_id=employee_id, room_id=room_id, slot=slot):
            return bad
        if not isinstance(attendees, int) or isinstance(attendees, bool) or attendees < 1:
            return _err("attendees must be a positive integer")
        if not isinstance(title, str):
            return _err("title must be a string")
        if employee_id not in self.employees:
            return _err(f"unknown employee {employee_id!r}")
        if problem := self._room_problem(room_id, slot, attendees):
            return _err(problem)
        bid = _new_id(self.bookings, "BK")
        self.bookings[bid] = {"room_id": room_id, "employee_id": employee_id, "slot": slot,
                              "attendees": attendees, "title": title}
        return _ok({"booking_id": bid})

    def cancel_booking(self, booking_id: str, employee_id: str):
        """Delete a booking; allowed for its owner and for facilities staff."""
        if bad := _bad_str(booking_id=booking_id, employee_id=employee_id):
            return bad
        booking = self.bookings.get(booking_id)
        if booking is None:
            return _err(f"unknown booking {booking_id!r}")
        actor = self.employees.get(employee_id)
        if actor is None or (booking["employee_id"] != employee_id and actor["role"] != "facilities"):
            return _err("permission denied: only the owner or facilities can cancel a booking")
        del self.bookings[booking_id]
        self.audit_log.append({"op": "cancel_booking", "actor": employee_id, "target": booking_id})
        return _ok({"cancelled": booking_id})

    def set_room_status(self, room_id: str, status: str, employee_id: str):
        """Facilities staff set a room available or out of service (only without bookings)."""
        if bad := _bad_str(room_id=room_id, status=status, employee_id=employee_id):
            return bad
        if self.employees.get(employee_id, {}).get("role") != "facilities":
            return _err("permission denied: only facilities can change room status")
        if status not in ("available", "out_of_service"):
            return _err("status must be available or out_of_service")
        if room_id not in self.rooms:
            return _err(f"unknown room {room_id!r}")
        if status == "out_of_service" and any(b["room_id"] == room_id for b in self.bookings.values()):
            return _err("the room still has bookings")
        self.rooms[room_id]["status"] = status
        self.audit_log.append({"op": "set_room_status", "actor": employee_id, "target": room_id})
        return _ok({"room_id": room_id, "status": status})
