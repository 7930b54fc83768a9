"""Fleet / vehicle rental: vehicles at branches, customers, rentals and counter staff."""


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


class FleetRental:
    def __init__(self, init_config):
        cfg = init_config or {}
        self.vehicles = cfg.get("vehicles", {})    # V01 -> {model, plate, branch, status, mileage}
        self.customers = cfg.get("customers", {})  # K001 -> {name, phone, license_valid}
        self.rentals = cfg.get("rentals", {})      # RN001 -> {vehicle_id, customer_id, status, start_mileage, end_mileage}
        self.staff = cfg.get("staff", {})          # F1 -> {name, role}
        self.audit_log = cfg.get("audit_log", [])  # [{op, actor, target}]

    def find_customer_by_name(self, name: str):
        if bad := _bad_str(name=name):
            return bad
        hits = [{"customer_id": k, **c} for k, c in self.customers.items() if c["name"].lower() == name.strip().lower()]
        return _ok(hits) if hits else _err(f"no customer named {name!r}")

    def list_vehicles(self, branch: str, status: str = ""):
        if bad := _bad_str(branch=branch):
            return bad
        if not isinstance(status, str):
            return _err("status must be a string")
        return _ok([{"vehicle_id": k, **v} for k, v in self.vehicles.items()
                    if v["branch"] == branch and (not status or v["status"] == status)])

    def list_rentals(self, customer_id: str = "", status: str = ""):
        if not isinstance(customer_id, str) or not isinstance(status, str):
            return _err("filters must be strings")
        return _ok([{"rental_id": k, **r} for k, r in self.rentals.items()
                    if (not customer_id or r["customer_id"] == customer_id) and (not status or r["status"] == status)])

    def update_customer_phone(self, customer_id: str, phone: str):
        if bad := _bad_str(customer_id=customer_id, phone=phone):
            return bad
        if customer_id not in self.customers:
            return _err(f"unknown customer {customer_id!r}")
        self.customers[customer_id]["phone"] = phone
        return _ok({"customer_id": customer_id, "phone": phone})

    def swap_rental_vehicle(self, rental_id: str, vehicle_id: str):
        """Put an active rental on another available vehicle; the old vehicle becomes available."""
        if bad := _bad_str(rental_id=rental_id, vehicle_id=vehicle_id):
            return bad
        rental, vehicle = self.rentals.get(rental_id), self.vehicles.get(vehicle_id)
        if rental is None or rental["status"] != "active":
            return _err(f"{rental_id!r} is not an active rental")
        if vehicle is None or vehicle["status"] != "available":
            return _err(f"vehicle {vehicle_id!r} is not available")
        if rental["vehicle_id"] in self.vehicles:
            self.vehicles[rental["vehicle_id"]]["status"] = "available"
        vehicle["status"] = "rented"
        rental.update(vehicle_id=vehicle_id, start_mileage=vehicle["mileage"])
        return _ok({"rental_id": rental_id, "vehicle_id": vehicle_id})

    def create_rental(self, customer_id: str, vehicle_id: str):
        """Rent an available vehicle to a licensed customer without another active rental."""
        if bad := _bad_str(customer_id=customer_id, vehicle_id=vehicle_id):
            return bad
        customer, vehicle = self.customers.get(customer_id), self.vehicles.get(vehicle_id)
        if customer is None or not customer["license_valid"]:
            return _err(f"{customer_id!r} has no valid driving licence on file")
        if any(r["customer_id"] == customer_id and r["status"] == "active" for r in self.rentals.values()):
            return _err(f"{customer_id} already has an active rental")
        if vehicle is None or vehicle["status"] != "available":
            return _err(f"vehicle {vehicle_id!r} is not available")
        vehicle["status"] = "rented"
        rid = _new_id(self.rentals, "RN")
        self.rentals[rid] = {"vehicle_id": vehicle_id, "customer_id": customer_id, "status": "active",
                             "start_mileage": vehicle["mileage"], "end_mileage": None}
        return _ok({"rental_id": rid})

    def close_rental(self, rental_id: str, mileage: int):
        if bad := _bad_str(rental_id=rental_id):
            return bad
        rental = self.rentals.get(rental_id)
        if rental is None or rental["status"] != "active":
            return _err(f"{rental_id!r} is not an active rental")
        if not isinstance(mileage, int) or isinstance(mileage, bool) or mileage < rental["start_mileage"]:
            return _err("mileage must be an integer no lower than the start mileage")
        rental.update(status="closed", end_mileage=mileage)
        if rental["vehicle_id"] in self.vehicles:
            self.vehicles[rental["vehicle_id"]].update(status="available", mileage=mileage)
        return _ok({"rental_id": rental_id, "status": "closed"})

    def set_vehicle_status(self, vehicle_id: str, status: str):
        if bad := _bad_str(vehicle_id=vehicle_id, status=status):
            return bad
        if status not in ("available", "maintenance"):
            return _err("status must be available or maintenance")
        vehicle = self.vehicles.get(vehicle_id)
        if vehicle is None:
            return _err(f"unknown vehicle {vehicle_id!r}")
        if vehicle["status"] == "rented":
            return _err("cannot change the status of a rented vehicle")
        vehicle["status"] = status
        return _ok({"vehicle_id": vehicle_id, "status": status})

    def find_staff_by_name(self, name: str):
        if bad := _bad_str(name=name):
            return bad
        hits = [{"staff_id": k, **s} for k, s in self.staff.items() if s["name"].lower() == name.strip().lower()]
        return _ok(hits) if hits else _err(f"no staff member named {name!r}")

    def retire_vehicle(self, vehicle_id: str, staff_id: str):
        """Managers remove a vehicle that is not rented from the fleet."""
        if bad := _bad_str(vehicle_id=vehicle_id, staff_id=staff_id):
            return bad
        if self.staff.get(staff_id, {}).get("role") != "manager":
            return _err("permission denied: only a manager can retire vehicles")
        vehicle = self.vehicles.get(vehicle_id)
        if vehicle is None:
            return _err(f"unknown vehicle {vehicle_id!r}")
        if vehicle["status"] == "rented":
            return _err("cannot retire a rented vehicle")
        del self.vehicles[vehicle_id]
        self.audit_log.append({"op": "retire_vehicle", "actor": staff_id, "target": vehicle_id})
        return _ok({"retired": vehicle_id})
