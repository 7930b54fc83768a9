"""Clinic bed management: patients, beds in wards, clinical staff and discharge records."""


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


class ClinicBedManagement:
    def __init__(self, init_config):
        cfg = init_config or {}
        self.patients = cfg.get("patients", {})      # P001 -> {name, phone, status, bed_id}
        self.beds = cfg.get("beds", {})              # B101 -> {ward, status, patient_id}
        self.staff = cfg.get("staff", {})            # S01 -> {name, role}
        self.discharges = cfg.get("discharges", {})  # D001 -> {patient_id, staff_id, bed_id, note}
        self.audit_log = cfg.get("audit_log", [])    # [{op, actor, target}]

    def find_patient_by_name(self, name: str):
        if bad := _bad_str(name=name):
            return bad
        hits = [{"patient_id": k, **p} for k, p in self.patients.items() if p["name"].lower() == name.strip().lower()]
        return _ok(hits) if hits else _err(f"no patient named {name!r}")

    def get_bed(self, bed_id: str):
        if bad := _bad_str(bed_id=bed_id):
            return bad
        if bed_id not in self.beds:
            return _err(f"unknown bed {bed_id!r}")
        return _ok({"bed_id": bed_id, **self.beds[bed_id]})

    def list_beds(self, ward: str, status: str = ""):
        if bad := _bad_str(ward=ward):
            return bad
        if not isinstance(status, str):
            return _err("status must be a string")
        return _ok([{"bed_id": k, **b} for k, b in self.beds.items()
                    if b["ward"] == ward and (not status or b["status"] == status)])

    def update_patient_phone(self, patient_id: str, phone: str):
        if bad := _bad_str(patient_id=patient_id, phone=phone):
            return bad
        if patient_id not in self.patients:
            return _err(f"unknown patient {patient_id!r}")
        self.patients[patient_id]["phone"] = phone
        return _ok({"patient_id": patient_id, "phone": phone})

    def transfer_patient(self, patient_id: str, bed_id: str):
        """Move an admitted patient to a free bed; the old bed goes to cleaning."""
        if bad := _bad_str(patient_id=patient_id, bed_id=bed_id):
            return bad
        patient, bed = self.patients.get(patient_id), self.beds.get(bed_id)
        if patient is None or bed is None:
            return _err("unknown patient or bed")
        if patient["status"] != "admitted":
            return _err("only admitted patients can be transferred")
        if bed["status"] != "free":
            return _err(f"bed {bed_id} is {bed['status']}, not free")
        old = patient["bed_id"]
        if old in self.beds:
            self.beds[old].update(status="cleaning", patient_id=None)
        bed.update(status="occupied", patient_id=patient_id)
        patient["bed_id"] = bed_id
        return _ok({"patient_id": patient_id, "from_bed": old, "to_bed": bed_id})

    def admit_patient(self, name: str, phone: str, bed_id: str):
        if bad := _bad_str(name=name, phone=phone, bed_id=bed_id):
            return bad
        bed = self.beds.get(bed_id)
        if bed is None or bed["status"] != "free":
            return _err(f"bed {bed_id!r} is not a free bed")
        pid = _new_id(self.patients, "P")
        self.patients[pid] = {"name": name, "phone": phone, "status": "admitted", "bed_id": bed_id}
        bed.update(status="occupied", patient_id=pid)
        return _ok({"patient_id": pid, "bed_id": bed_id})

    def find_staff_by_name(self, name: str):
        if bad := _bad_str(name=name):
            return bad
        hits = [{"staff_id": k, **s} for k, s in self.staff.items() if s["name"].lower() == name.strip().lower()]
        return _ok(hits) if hits else _err(f"no staff member named {name!r}")

    def discharge_patient(self, patient_id: str, staff_id: str, note: str = ""):
        """A doctor discharges an admitted patient; the bed goes to cleaning."""
        if bad := _bad_str(patient_id=patient_id, staff_id=staff_id):
            return bad
        if not isinstance(note, str):
            return _err("note must be a string")
        if self.staff.get(staff_id, {}).get("role") != "doctor":
            return _err("permission denied: only a doctor can discharge")
        patient = self.patients.get(patient_id)
        if patient is None or patient["status"] != "admitted":
            return _err(f"{patient_id!r} is not an admitted patient")
        bed_id = patient["bed_id"]
        if bed_id in self.beds:
            self.beds[bed_id].update(status="cleaning", patient_id=None)
        patient.update(status="discharged", bed_id=None)
        did = _new_id(self.discharges, "D")
        self.discharges[did] = {"patient_id": patient_id, "staff_id": staff_id, "bed_id": bed_id, "note": note}
        self.audit_log.append({"op": "discharge_patient", "actor": staff_id, "target": patient_id})
        return _ok({"discharge_id": did, "bed_id": bed_id})

    def delete_patient_record(self, patient_id: str, staff_id: str):
        """An admin deletes the record of a discharged patient."""
        if bad := _bad_str(patient_id=patient_id, staff_id=staff_id):
            return bad
        if self.staff.get(staff_id, {}).get("role") != "admin":
            return _err("permission denied: only an admin can delete patient records")
        patient = self.patients.get(patient_id)
        if patient is None:
            return _err(f"unknown patient {patient_id!r}")
        if patient["status"] != "discharged":
            return _err("cannot delete the record of a patient who is still admitted")
        del self.patients[patient_id]
        self.audit_log.append({"op": "delete_patient_record", "actor": staff_id, "target": patient_id})
        return _ok({"deleted": patient_id})

    def set_bed_status(self, bed_id: str, status: str):
        if bad := _bad_str(bed_id=bed_id, status=status):
            return bad
        if status not in ("free", "cleaning", "maintenance"):
            return _err("status must be free, cleaning or maintenance")
        bed = self.beds.get(bed_id)
        if bed is None:
            return _err(f"unknown bed {bed_id!r}")
        if bed["status"] == "occupied":
            return _err("cannot change the status of an occupied bed")
        bed["status"] = status
        return _ok({"bed_id": bed_id, "status": status})
