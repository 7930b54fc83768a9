"""Clinic bed management: metadata and task builders."""

from __future__ import annotations

import copy

from envsched_jax.pool.embedded._spec import (TaskSpec, add_bystanders, absent, act, field_eq, logged, new_records,
                                              others_unchanged, reply, table_size, unchanged, where_eq)
from envsched_jax.pool.embedded.envs.clinic_beds import ClinicBedManagement

ENV_ID = "clinic_beds"
CLASS = ClinicBedManagement
SUMMARY = ("A hospital clinic's bed board. Patients are admitted into beds that belong to wards; "
           "staff (nurses, doctors, admins) act on them. Transfers need a free target bed and leave "
           "the old bed for cleaning, admissions create patient records with generated ids, only "
           "doctors discharge (which creates a discharge record) and only admins delete the records "
           "of discharged patients. Occupied beds cannot have their status changed.")
STATE_SPACE = (
    {"entity": "Patient", "attributes": "patient_id, name, phone, status (admitted|discharged), bed_id",
     "description": "A person treated at the clinic; an admitted patient occupies one bed."},
    {"entity": "Bed", "attributes": "bed_id, ward, status (free|occupied|cleaning|maintenance), patient_id",
     "description": "A bed in a ward."},
    {"entity": "Staff", "attributes": "staff_id, name, role (nurse|doctor|admin)",
     "description": "A clinic employee who may act on records."},
    {"entity": "Discharge", "attributes": "discharge_id, patient_id, staff_id, bed_id, note",
     "description": "The record of one discharge."},
    {"entity": "AuditLog", "attributes": "op, actor, target",
     "description": "Privileged actions, in order."},
)
CONSTRAINTS = (
    "A patient can only be transferred into a bed whose status is free.",
    "Only admitted patients can be transferred or discharged.",
    "After a transfer or discharge the previous bed's status becomes cleaning.",
    "Only staff with role doctor may discharge a patient.",
    "Only staff with role admin may delete a patient record, and only for discharged patients.",
    "The status of an occupied bed cannot be changed directly.",
)
TOOL_DOCS = {
    "find_patient_by_name": ("query", "Find patients by full name (case-insensitive); returns their ids and records.",
                             {"name": "Full name of the patient"}),
    "get_bed": ("query", "Get one bed by id.", {"bed_id": "Bed id, e.g. B101"}),
    "list_beds": ("query", "List the beds of a ward, optionally only those with a given status.",
                  {"ward": "Ward name, e.g. North", "status": "Optional status filter (free, occupied, cleaning, maintenance)"}),
    "update_patient_phone": ("state_change", "Change a patient's phone number.",
                             {"patient_id": "Patient id", "phone": "New phone number"}),
    "transfer_patient": ("state_change", "Move an admitted patient into a free bed; the old bed goes to cleaning.",
                         {"patient_id": "Patient id", "bed_id": "Target bed id"}),
    "admit_patient": ("state_change", "Admit a new patient into a free bed; returns the new patient id.",
                      {"name": "Full name", "phone": "Phone number", "bed_id": "A free bed id"}),
    "find_staff_by_name": ("query", "Find staff members by full name; returns ids and roles.",
                           {"name": "Full name of the staff member"}),
    "discharge_patient": ("state_change", "Discharge an admitted patient (doctors only); creates a discharge record.",
                          {"patient_id": "Patient id", "staff_id": "Id of the acting doctor", "note": "Optional discharge note"}),
    "delete_patient_record": ("state_change", "Delete a discharged patient's record (admins only).",
                              {"patient_id": "Patient id", "staff_id": "Id of the acting admin"}),
    "set_bed_status": ("state_change", "Set a non-occupied bed's status to free, cleaning or maintenance.",
                       {"bed_id": "Bed id", "status": "free, cleaning or maintenance"}),
}

_BASE = {
    "patients": {
        "P001": {"name": "Maria Lopez", "phone": "555-0101", "status": "admitted", "bed_id": "B101"},
        "P002": {"name": "James Chen", "phone": "555-0102", "status": "admitted", "bed_id": "B102"},
        "P003": {"name": "Aisha Khan", "phone": "555-0103", "status": "admitted", "bed_id": "B201"},
        "P004": {"name": "Tom Becker", "phone": "555-0104", "status": "admitted", "bed_id": "B204"},
        "P005": {"name": "Lena Novak", "phone": "555-0105", "status": "discharged", "bed_id": None},
        "P006": {"name": "Omar Haddad", "phone": "555-0106", "status": "discharged", "bed_id": None},
    },
    "beds": {
        "B101": {"ward": "North", "status": "occupied", "patient_id": "P001"},
        "B102": {"ward": "North", "status": "occupied", "patient_id": "P002"},
        "B103": {"ward": "North", "status": "free", "patient_id": None},
        "B104": {"ward": "North", "status": "cleaning", "patient_id": None},
        "B105": {"ward": "North", "status": "cleaning", "patient_id": None},
        "B201": {"ward": "South", "status": "occupied", "patient_id": "P003"},
        "B202": {"ward": "South", "status": "free", "patient_id": None},
        "B203": {"ward": "South", "status": "maintenance", "patient_id": None},
        "B204": {"ward": "South", "status": "occupied", "patient_id": "P004"},
        "B205": {"ward": "South", "status": "free", "patient_id": None},
    },
    "staff": {
        "S01": {"name": "Helen Park", "role": "doctor"},
        "S02": {"name": "Ben Ito", "role": "nurse"},
        "S03": {"name": "Grace Wu", "role": "admin"},
        "S04": {"name": "Raj Patel", "role": "doctor"},
        "S05": {"name": "Kim Lee", "role": "nurse"},
    },
    "discharges": {"D001": {"patient_id": "P005", "staff_id": "S01", "bed_id": "B103", "note": "recovered"}},
    "audit_log": [],
}


def _state(**beds):
    """The base state with some bed statuses overridden (a bed set free loses its patient)."""
    s = copy.deepcopy(_BASE)
    for bed_id, status in beds.items():
        s["beds"][bed_id]["status"] = status
    return s


def _lookup_update():
    out = []
    for pid, name, phone, text in [
        ("P001", "Maria Lopez", "555-0199", "Please change Maria Lopez's phone number to 555-0199."),
        ("P003", "Aisha Khan", "555-7788", "Aisha Khan has a new mobile: 555-7788. Update her record."),
        ("P005", "Lena Novak", "555-3141", "Former patient Lena Novak asked us to store 555-3141 as her phone."),
        ("P004", "Tom Becker", "555-2020", "Record 555-2020 as the contact number for Tom Becker."),
    ]:
        s = _state()
        out.append(TaskSpec(
            text, s,
            [field_eq(f"{name}'s phone is {phone}", ["patients", pid, "phone"], phone),
             unchanged(f"{name}'s status is unchanged", ["patients", pid, "status"]),
             others_unchanged("no other patient record changed", "patients", [pid]),
             unchanged("beds are unchanged", ["beds"])],
            [act("find_patient_by_name", name=name), act("update_patient_phone", patient_id=pid, phone=phone),
             reply(f"{name}'s phone number is now {phone}.")],
            "lookup_update",
            wrong=[[act("update_patient_phone", patient_id="P002", phone=phone), reply("done")]] if pid == "P001" else []))
    return out


def _reassign():
    out = []
    # (patient, name, old bed, target, fallback or None, bed overrides)
    for pid, name, old, target, fallback, over in [
        ("P001", "Maria Lopez", "B101", "B103", None, {}),
        ("P003", "Aisha Khan", "B201", "B205", None, {}),
        ("P002", "James Chen", "B102", "B104", "B103", {}),
        ("P004", "Tom Becker", "B204", "B203", None, {"B202": "cleaning", "B205": "cleaning"}),
    ]:
        s = _state(**over)
        if fallback is None and s["beds"][target]["status"] == "free":
            text = f"Transfer {name} to bed {target}."
            checks = [field_eq(f"{name} is in {target}", ["patients", pid, "bed_id"], target),
                      field_eq(f"{target} is occupied by {pid}", ["beds", target, "patient_id"], pid),
                      field_eq(f"{old} is being cleaned", ["beds", old, "status"], "cleaning")]
            actions = [act("find_patient_by_name", name=name), act("get_bed", bed_id=target),
                       act("transfer_patient", patient_id=pid, bed_id=target), reply(f"{name} moved to {target}.")]
            out.append(TaskSpec(text, s, checks, actions, "reassign_gated"))
        elif fallback is not None:
            text = (f"Move {name} into bed {target}. If {target} is not free, put {name.split()[0]} "
                    f"in {fallback} instead.")
            checks = [field_eq(f"{name} is in {fallback}", ["patients", pid, "bed_id"], fallback),
                      field_eq(f"{fallback} is occupied by {pid}", ["beds", fallback, "patient_id"], pid),
                      unchanged(f"{target} is unchanged", ["beds", target]),
                      field_eq(f"{old} is being cleaned", ["beds", old, "status"], "cleaning")]
            actions = [act("find_patient_by_name", name=name), act("get_bed", bed_id=target),
                       act("transfer_patient", patient_id=pid, bed_id=fallback), reply(f"{target} was not free; {name} is in {fallback}.")]
            out.append(TaskSpec(text, s, checks, actions, "reassign_gated", "fail",
                                wrong=[[act("transfer_patient", patient_id=pid, bed_id=target), reply("done")]]))
        else:
            text = (f"Can {name} go to bed {target}? Only if it is free; otherwise leave him where he is "
                    f"and just put {target} into cleaning so it gets turned around.")
            checks = [unchanged(f"{name} stays in {old}", ["patients", pid]),
                      unchanged(f"{old} still holds {name}", ["beds", old]),
                      field_eq(f"{target} is being cleaned", ["beds", target, "status"], "cleaning")]
            actions = [act("find_patient_by_name", name=name), act("get_bed", bed_id=target),
                       act("set_bed_status", bed_id=target, status="cleaning"), reply(f"{target} is not free; {name} stays in {old}.")]
            out.append(TaskSpec(text, s, checks, actions, "reassign_gated", "fail",
                                wrong=[[act("set_bed_status", bed_id=target, status="free"),
                                        act("transfer_patient", patient_id=pid, bed_id=target), reply("done")]]))
    return out


def _create():
    out = []
    for name, phone, bed, ward, via_list in [
        ("Nora Quinn", "555-4001", "B103", "North", False),
        ("Felix Grant", "555-4002", "B202", "South", False),
        ("Yara Said", "555-4003", "B103", "North", True),
        ("Victor Hale", "555-4004", "B205", "South", True),
    ]:
        s = _state(**({"B202": "maintenance"} if bed == "B205" else {}))
        if via_list:
            text = f"Admit {name} (phone {phone}) to the free bed in the {ward} ward."
            actions = [act("list_beds", ward=ward, status="free")]
        else:
            text = f"New admission: {name}, phone {phone}, into bed {bed}."
            actions = [act("get_bed", bed_id=bed)]
        actions += [act("admit_patient", name=name, phone=phone, bed_id=bed), reply(f"{name} admitted to {bed}.")]
        checks = [new_records(f"one new admitted patient {name} in {bed}", "patients",
                              {"name": name, "phone": phone, "status": "admitted", "bed_id": bed}),
                  field_eq(f"{bed} is occupied", ["beds", bed, "status"], "occupied"),
                  table_size("exactly one patient record was added", "patients", 1)]
        out.append(TaskSpec(text, s, checks, actions, "create_gated"))
    return out


def _delete():
    out = []
    for pid, name, actor, actor_id, admin in [
        ("P005", "Lena Novak", "Grace Wu", "S03", None),
        ("P006", "Omar Haddad", "Ben Ito", "S02", ("Grace Wu", "S03")),
        ("P006", "Omar Haddad", "Grace Wu", "S03", None),
        ("P005", "Lena Novak", "Raj Patel", "S04", ("Grace Wu", "S03")),
    ]:
        s = _state()
        if admin is None:
            text = f"I'm {actor}. Please delete the record of discharged patient {name}."
            by = actor_id
            actions = [act("find_staff_by_name", name=actor), act("find_patient_by_name", name=name),
                       act("delete_patient_record", patient_id=pid, staff_id=actor_id)]
            wrong = []
        else:
            text = (f"{actor} wants the record of {name} removed. If {actor} is not allowed to delete records, "
                    f"do it on behalf of {admin[0]} instead.")
            by = admin[1]
            actions = [act("find_staff_by_name", name=actor), act("find_staff_by_name", name=admin[0]),
                       act("find_patient_by_name", name=name),
                       act("delete_patient_record", patient_id=pid, staff_id=admin[1])]
            wrong = [[act("delete_patient_record", patient_id=pid, staff_id=actor_id), reply("done")]]
        checks = [absent(f"{name}'s record is deleted", "patients", pid),
                  logged(f"the deletion was done by {by}", "delete_patient_record", by, pid),
                  others_unchanged("no other patient record changed", "patients", [pid])]
        out.append(TaskSpec(text, s, checks, actions + [reply(f"{name}'s record was deleted.")],
                            "authorized_delete", "pass" if admin is None else "fail", wrong=wrong))
    return out


def _multi_step():
    out = []
    for pid, name, bed, doctor, doc_id, newcomer, phone in [
        ("P002", "James Chen", "B102", "Helen Park", "S01", "Ida Moss", "555-5001"),
        ("P003", "Aisha Khan", "B201", "Raj Patel", "S04", "Leo Brandt", "555-5002"),
        ("P001", "Maria Lopez", "B101", "Raj Patel", "S04", "Zoe Adler", "555-5003"),
        ("P004", "Tom Becker", "B204", "Helen Park", "S01", "Sam Oduya", "555-5004"),
    ]:
        s = _state()
        text = (f"Dr. {doctor} is discharging {name} (note: 'follow-up in 2 weeks'). Once the bed is cleaned, "
                f"mark it free and admit {newcomer} (phone {phone}) into it.")
        checks = [field_eq(f"{name} is discharged", ["patients", pid, "status"], "discharged"),
                  new_records(f"a discharge record for {pid} by {doc_id}", "discharges",
                              {"patient_id": pid, "staff_id": doc_id, "bed_id": bed}),
                  new_records(f"{newcomer} admitted into {bed}", "patients",
                              {"name": newcomer, "status": "admitted", "bed_id": bed}),
                  field_eq(f"{bed} is occupied", ["beds", bed, "status"], "occupied")]
        actions = [act("find_patient_by_name", name=name), act("find_staff_by_name", name=doctor),
                   act("discharge_patient", patient_id=pid, staff_id=doc_id, note="follow-up in 2 weeks"),
                   act("set_bed_status", bed_id=bed, status="free"),
                   act("admit_patient", name=newcomer, phone=phone, bed_id=bed),
                   reply(f"{name} discharged; {newcomer} admitted to {bed}.")]
        out.append(TaskSpec(text, s, checks, actions, "multi_step",
                            wrong=[[act("discharge_patient", patient_id=pid, staff_id="S02"),
                                    act("admit_patient", name=newcomer, phone=phone, bed_id=bed), reply("done")]]))
    return out


def _bulk():
    out = []
    for ward, frm, to, over in [
        ("North", "cleaning", "free", {}),
        ("South", "free", "maintenance", {}),
        ("South", "cleaning", "free", {"B202": "cleaning", "B205": "cleaning"}),
        ("North", "free", "cleaning", {"B104": "free"}),
    ]:
        s = _state(**over)
        ids = [k for k, b in s["beds"].items() if b["ward"] == ward and b["status"] == frm]
        text = f"Set every {frm} bed in the {ward} ward to {to}."
        checks = [where_eq(f"all {frm} beds in {ward} are now {to}", "beds", {"ward": ward, "status": frm}, "status", to),
                  others_unchanged("no other bed changed", "beds", ids),
                  unchanged("patients are unchanged", ["patients"])]
        actions = [act("list_beds", ward=ward, status=frm)]
        actions += [act("set_bed_status", bed_id=b, status=to) for b in ids]
        out.append(TaskSpec(text, s, checks, actions + [reply(f"Updated {', '.join(ids)}.")], "filter_bulk_update"))
    return out


def build_tasks() -> list[TaskSpec]:
    tasks = _lookup_update() + _reassign() + _create() + _delete() + _multi_step() + _bulk()
    return add_bystanders(tasks, "patients", "P", lambda name, k: {"name": name, "phone": f"555-8{k:03d}", "status": "discharged", "bed_id": None})
