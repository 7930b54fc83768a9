"""Course enrollment: metadata and task builders."""

from __future__ import annotations

import copy

from envsched_jax.pool.embedded._spec import (TaskSpec, add_bystanders, absent, act, all_field_eq, field_eq, logged, new_records,
                                              others_unchanged, reply, unchanged)
from envsched_jax.pool.embedded.envs.course_enrollment import CourseEnrollment

ENV_ID = "course_enrollment"
CLASS = CourseEnrollment
SUMMARY = ("A university registrar's enrollment system. Courses have a seat capacity, an open or "
           "closed status and an optional prerequisite; an active student can enroll (generated "
           "enrollment id) or move an enrollment into a course only if it is open, has a free seat "
           "and the prerequisite is completed. Enrollments can be dropped, and only registrars (not "
           "advisors) may delete a student, and only one without active enrollments.")
STATE_SPACE = (
    {"entity": "Student", "attributes": "student_id, name, email, status (active|on_leave), completed (course ids)",
     "description": "A student and the courses they have completed."},
    {"entity": "Course", "attributes": "course_id, title, department, capacity, status (open|closed), prerequisite",
     "description": "A course offering."},
    {"entity": "Enrollment", "attributes": "enrollment_id, student_id, course_id, status (enrolled|dropped)",
     "description": "A student's seat in a course."},
    {"entity": "Staff", "attributes": "staff_id, name, role (advisor|registrar)", "description": "Academic staff."},
    {"entity": "AuditLog", "attributes": "op, actor, target", "description": "Privileged actions."},
)
CONSTRAINTS = (
    "Only active students can enroll or transfer an enrollment.",
    "A course accepts enrollments only while open and while enrolled seats are below capacity.",
    "A course's prerequisite must be in the student's completed list.",
    "A student cannot hold two active enrollments in the same course.",
    "Only registrars can delete a student, and only one without active enrollments.",
)
TOOL_DOCS = {
    "find_student_by_name": ("query", "Find students by full name.", {"name": "Full name"}),
    "list_courses": ("query", "List the courses of a department, optionally only open ones.",
                     {"department": "Department, e.g. CS", "open_only": "Only open courses"}),
    "list_enrollments": ("query", "List enrollments filtered by student, course and status.",
                         {"student_id": "Optional student id", "course_id": "Optional course id", "status": "Optional status (enrolled or dropped)"}),
    "update_student_email": ("state_change", "Change a student's email.", {"student_id": "Student id", "email": "New email"}),
    "enroll_student": ("state_change", "Enroll a student in a course; returns the enrollment id.",
                       {"student_id": "Student id", "course_id": "Course id"}),
    "transfer_enrollment": ("state_change", "Move an active enrollment to another course.",
                            {"enrollment_id": "Enrollment id", "course_id": "Target course id"}),
    "drop_enrollment": ("state_change", "Drop an active enrollment.", {"enrollment_id": "Enrollment id"}),
    "find_staff_by_name": ("query", "Find staff by full name; returns ids and roles.", {"name": "Full name"}),
    "delete_student": ("state_change", "Delete a student without active enrollments (registrars only).",
                       {"student_id": "Student id", "staff_id": "Id of the acting registrar"}),
}

_BASE = {
    "students": {
        "ST01": {"name": "Amara Obi", "email": "amara@uni.test", "status": "active", "completed": ["CS101"]},
        "ST02": {"name": "Bao Tran", "email": "bao@uni.test", "status": "active", "completed": ["CS101", "CS201"]},
        "ST03": {"name": "Carla Ruiz", "email": "carla@uni.test", "status": "active", "completed": []},
        "ST04": {"name": "Dmitri Volkov", "email": "dmitri@uni.test", "status": "on_leave", "completed": ["MA101"]},
        "ST05": {"name": "Elif Kaya", "email": "elif@uni.test", "status": "active", "completed": ["MA101"]},
        "ST06": {"name": "Finn Murphy", "email": "finn@uni.test", "status": "active", "completed": []},
        "ST07": {"name": "Gus Horn", "email": "gus@uni.test", "status": "active", "completed": []},
        "ST08": {"name": "Hana Ito", "email": "hana@uni.test", "status": "active", "completed": ["MA101"]},
    },
    "courses": {
        "CS101": {"title": "Intro to Programming", "department": "CS", "capacity": 3, "status": "open", "prerequisite": None},
        "CS201": {"title": "Data Structures", "department": "CS", "capacity": 2, "status": "open", "prerequisite": "CS101"},
        "CS301": {"title": "Algorithms", "department": "CS", "capacity": 2, "status": "open", "prerequisite": "CS201"},
        "MA101": {"title": "Calculus I", "department": "Math", "capacity": 3, "status": "open", "prerequisite": None},
        "MA201": {"title": "Linear Algebra", "department": "Math", "capacity": 1, "status": "open", "prerequisite": "MA101"},
        "HI110": {"title": "World History", "department": "History", "capacity": 4, "status": "closed", "prerequisite": None},
    },
    "enrollments": {
        "EN001": {"student_id": "ST01", "course_id": "CS201", "status": "enrolled"},
        "EN002": {"student_id": "ST02", "course_id": "CS301", "status": "enrolled"},
        "EN003": {"student_id": "ST03", "course_id": "CS101", "status": "enrolled"},
        "EN004": {"student_id": "ST05", "course_id": "MA201", "status": "enrolled"},
        "EN005": {"student_id": "ST06", "course_id": "CS101", "status": "enrolled"},
        "EN006": {"student_id": "ST03", "course_id": "MA101", "status": "enrolled"},
        "EN007": {"student_id": "ST04", "course_id": "MA101", "status": "dropped"},
        "EN008": {"student_id": "ST05", "course_id": "CS101", "status": "enrolled"},
    },
    "staff": {
        "R1": {"name": "Helga Brandt", "role": "registrar"},
        "R2": {"name": "Ivo Lange", "role": "advisor"},
        "R3": {"name": "Jana Novak", "role": "registrar"},
    },
    "audit_log": [],
}
_N = {k: s["name"] for k, s in _BASE["students"].items()}
_T = {k: c["title"] for k, c in _BASE["courses"].items()}
_S = {k: s["name"] for k, s in _BASE["staff"].items()}


def _state():
    return copy.deepcopy(_BASE)


def _course_look(cid):
    return act("list_courses", department=_BASE["courses"][cid]["department"], open_only=True)


def _lookup_update():
    out = []
    for sid, email, text in [("ST01", "amara.obi@uni.test", "Amara Obi wants her email changed to amara.obi@uni.test."),
                             ("ST04", "d.volkov@uni.test", "Update Dmitri Volkov's email to d.volkov@uni.test while he is on leave."),
                             ("ST06", "finn.m@uni.test", "Student Finn Murphy: new email finn.m@uni.test."),
                             ("ST08", "hana.ito@uni.test", "Set Hana Ito's email address to hana.ito@uni.test.")]:
        out.append(TaskSpec(
            text, _state(),
            [field_eq(f"{_N[sid]}'s email is {email}", ["students", sid, "email"], email),
             unchanged("status unchanged", ["students", sid, "status"]),
             others_unchanged("no other student changed", "students", [sid]),
             unchanged("enrollments unchanged", ["enrollments"])],
            [act("find_student_by_name", name=_N[sid]), act("update_student_email", student_id=sid, email=email),
             reply("Email updated.")],
            "lookup_update",
            wrong=[[act("update_student_email", student_id="ST02", email=email), reply("done")]] if sid == "ST01" else []))
    return out


def _reassign():
    out = []
    for eid, to, fallback in [("EN001", "MA101", None), ("EN003", "MA201", None), ("EN005", "CS201", "MA101"), ("EN001", "MA201", "enroll")]:
        s = _state()
        if eid == "EN003":  # free the Linear Algebra seat and give Carla the prerequisite
            s["courses"]["MA201"]["capacity"] = 2
            s["students"]["ST03"]["completed"] = ["MA101"]
            s["enrollments"]["EN006"]["status"] = "dropped"
        e = s["enrollments"][eid]
        who, frm = _N[e["student_id"]], e["course_id"]
        look = [act("find_student_by_name", name=who), act("list_enrollments", student_id=e["student_id"], status="enrolled"),
                _course_look(to), act("list_enrollments", course_id=to, status="enrolled")]
        if fallback is None:
            text = f"{who} wants to switch from {_T[frm]} to {_T[to]}."
            checks = [field_eq(f"{eid} is now in {to}", ["enrollments", eid, "course_id"], to),
                      field_eq(f"{eid} is still enrolled", ["enrollments", eid, "status"], "enrolled"),
                      others_unchanged("no other enrollment changed", "enrollments", [eid])]
            out.append(TaskSpec(text, s, checks, look + [act("transfer_enrollment", enrollment_id=eid, course_id=to),
                                                        reply(f"Moved to {_T[to]}.")], "reassign_gated"))
        elif fallback == "enroll":
            text = (f"Move {who} from {_T[frm]} into {_T[to]}. If {_T[to]} is full, keep her in {_T[frm]} "
                    f"and enroll her in Calculus I as well.")
            checks = [unchanged(f"{eid} is unchanged", ["enrollments", eid]),
                      new_records(f"{who} enrolled in Calculus I", "enrollments", {"student_id": e["student_id"], "course_id": "MA101", "status": "enrolled"}),
                      others_unchanged("no other enrollment changed", "enrollments", [])]
            actions = look + [act("enroll_student", student_id=e["student_id"], course_id="MA101"),
                              reply(f"{_T[to]} is full; {who} stays and is now also in Calculus I.")]
            out.append(TaskSpec(text, s, checks, actions, "reassign_gated", "fail",
                                wrong=[[act("drop_enrollment", enrollment_id=eid),
                                        act("enroll_student", student_id=e["student_id"], course_id="MA101"), reply("done")]]))
        else:
            text = f"Transfer {who} from {_T[frm]} to {_T[to]}; if that isn't possible, put him in {_T[fallback]} instead."
            checks = [field_eq(f"{eid} is now in {fallback}", ["enrollments", eid, "course_id"], fallback),
                      field_eq(f"{eid} is still enrolled", ["enrollments", eid, "status"], "enrolled"),
                      others_unchanged("no other enrollment changed", "enrollments", [eid])]
            actions = look + [_course_look(fallback), act("transfer_enrollment", enrollment_id=eid, course_id=fallback),
                              reply(f"{who} lacks the prerequisite; moved to {_T[fallback]}.")]
            out.append(TaskSpec(text, s, checks, actions, "reassign_gated", "fail",
                                wrong=[[act("transfer_enrollment", enrollment_id=eid, course_id=to), reply("done")]]))
    return out


def _create():
    out = []
    for sid, cid, alt in [("ST06", "MA101", None), ("ST02", "MA101", None), ("ST08", "CS101", None), ("ST07", "CS201", "MA101")]:
        s = _state()
        if cid == "CS101":
            s["enrollments"]["EN008"]["status"] = "dropped"
        made = alt or cid
        text = f"Enroll {_N[sid]} in {_T[cid]}."
        if alt:
            text += f" If he doesn't meet the requirements, enroll him in {_T[alt]} instead."
        checks = [new_records(f"{_N[sid]} enrolled in {made}", "enrollments", {"student_id": sid, "course_id": made, "status": "enrolled"}),
                  others_unchanged("existing enrollments unchanged", "enrollments", []),
                  unchanged("students unchanged", ["students"])]
        actions = [act("find_student_by_name", name=_N[sid]), _course_look(cid)] + ([_course_look(alt)] if alt else [])
        actions += [act("enroll_student", student_id=sid, course_id=made), reply("Enrolled.")]
        out.append(TaskSpec(text, s, checks, actions, "create_gated", "fail" if alt else "pass"))
    return out


def _delete():
    out = []
    for sid, actor, boss in [("ST04", "R1", None), ("ST04", "R2", "R3"), ("ST07", "R3", None), ("ST07", "R2", "R1")]:
        if boss is None:
            text, by = f"Registrar {_S[actor]} here: delete the student record of {_N[sid]}.", actor
            actions = [act("find_staff_by_name", name=_S[actor]), act("find_student_by_name", name=_N[sid]),
                       act("list_enrollments", student_id=sid, status="enrolled"), act("delete_student", student_id=sid, staff_id=actor)]
            wrong = []
        else:
            text = f"Advisor {_S[actor]} asks to remove {_N[sid]} from the system. If advisors can't, have {_S[boss]} do it."
            by = boss
            actions = [act("find_staff_by_name", name=_S[actor]), act("find_staff_by_name", name=_S[boss]),
                       act("find_student_by_name", name=_N[sid]), act("delete_student", student_id=sid, staff_id=boss)]
            wrong = [[act("delete_student", student_id=sid, staff_id=actor), reply("done")]]
        checks = [absent(f"{_N[sid]} is deleted", "students", sid), logged(f"deleted by {by}", "delete_student", by, sid),
                  others_unchanged("no other student changed", "students", [sid])]
        out.append(TaskSpec(text, _state(), checks, actions + [reply("Student deleted.")],
                            "authorized_delete", "pass" if boss is None else "fail", wrong=wrong))
    return out


def _multi_step():
    out = []
    for drop_eid, newcomer in [("EN005", "ST07"), ("EN004", "ST08"), ("EN003", "ST07"), ("EN008", "ST08")]:
        s = _state()
        e = s["enrollments"][drop_eid]
        leaver, cid = _N[e["student_id"]], e["course_id"]
        text = (f"{leaver} is dropping {_T[cid]}. Process the drop, then give the freed seat to {_N[newcomer]}, "
                f"who is waiting for it.")
        checks = [field_eq(f"{drop_eid} is dropped", ["enrollments", drop_eid, "status"], "dropped"),
                  new_records(f"{_N[newcomer]} enrolled in {cid}", "enrollments", {"student_id": newcomer, "course_id": cid, "status": "enrolled"}),
                  others_unchanged("no other enrollment changed", "enrollments", [drop_eid, "EN009"])]
        actions = [act("find_student_by_name", name=leaver), act("list_enrollments", student_id=e["student_id"], status="enrolled"),
                   act("drop_enrollment", enrollment_id=drop_eid), act("find_student_by_name", name=_N[newcomer]),
                   act("enroll_student", student_id=newcomer, course_id=cid), reply("Seat reassigned.")]
        out.append(TaskSpec(text, s, checks, actions, "multi_step",
                            wrong=[[act("enroll_student", student_id=newcomer, course_id=cid), reply("done")]]))
    return out


def _bulk():
    out = []
    for key, value, text in [("course_id", "CS101", "Intro to Programming is cancelled this term. Drop every active enrollment in it."),
                             ("student_id", "ST03", "Carla Ruiz is taking a leave of absence: drop all her active enrollments."),
                             ("course_id", "MA101", "Drop all active enrollments in Calculus I; the section is being merged."),
                             ("student_id", "ST05", "Withdraw Elif Kaya from every course she is enrolled in.")]:
        s = _state()
        s["enrollments"]["EN009"] = {"student_id": "ST08", "course_id": "MA101", "status": "enrolled"}
        ids = [k for k, e in s["enrollments"].items() if e[key] == value and e["status"] == "enrolled"]
        checks = [all_field_eq(f"{', '.join(ids)} are dropped", "enrollments", ids, "status", "dropped"),
                  others_unchanged("no other enrollment changed", "enrollments", ids), unchanged("courses unchanged", ["courses"])]
        first = act("find_student_by_name", name=_N[value]) if key == "student_id" else _course_look(value)
        actions = [first, act("list_enrollments", status="enrolled", **{key: value})]
        actions += [act("drop_enrollment", enrollment_id=k) for k in ids]
        out.append(TaskSpec(text, s, checks, actions + [reply(f"Dropped {', '.join(ids)}.")], "filter_bulk_update"))
    return out


def build_tasks() -> list[TaskSpec]:
    tasks = _lookup_update() + _reassign() + _create() + _delete() + _multi_step() + _bulk()
    return add_bystanders(tasks, "students", "ST", lambda name, k: {"name": name, "email": f"student{k}@uni.test", "status": "active", "completed": []})
