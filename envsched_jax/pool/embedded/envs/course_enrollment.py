"""Course enrollment: students, course sections with seats and prerequisites, registrar staff."""


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


class CourseEnrollment:
    def __init__(self, init_config):
        cfg = init_config or {}
        self.students = cfg.get("students", {})        # ST01 -> {name, email, status, completed}
        self.courses = cfg.get("courses", {})          # CS101 -> {title, department, capacity, status, prerequisite}
        self.enrollments = cfg.get("enrollments", {})  # EN001 -> {student_id, course_id, status}
        self.staff = cfg.get("staff", {})              # R1 -> {name, role}
        self.audit_log = cfg.get("audit_log", [])      # [{op, actor, target}]

    def _seat_problem(self, student_id, course_id):
        student, course = self.students.get(student_id), self.courses.get(course_id)
        if student is None or course is None:
            return "unknown student or course"
        if student["status"] != "active":
            return f"student {student_id} is {student['status']}"
        if course["status"] != "open":
            return f"course {course_id} is {course['status']}"
        if course["prerequisite"] and course["prerequisite"] not in student["completed"]:
            return f"prerequisite {course['prerequisite']} not completed"
        taken = sum(e["course_id"] == course_id and e["status"] == "enrolled" for e in self.enrollments.values())
        if taken >= course["capacity"]:
            return f"course {course_id} is full"
        if any(e["student_id"] == student_id and e["course_id"] == course_id and e["status"] == "enrolled"
               for e in self.enrollments.values()):
            return "already enrolled"
        return None

    def find_student_by_name(self, name: str):
        if bad := _bad_str(name=name):
            return bad
        hits = [{"student_id": k, **s} for k, s in self.students.items() if s["name"].lower() == name.strip().lower()]
        return _ok(hits) if hits else _err(f"no student named {name!r}")

    def list_courses(self, department: str, open_only: bool = False):
        if bad := _bad_str(department=department):
            return bad
        return _ok([{"course_id": k, **c} for k, c in self.courses.items()
                    if c["department"] == department and not (open_only is True and c["status"] != "open")])

    def list_enrollments(self, student_id: str = "", course_id: str = "", status: str = ""):
        if not all(isinstance(v, str) for v in (student_id, course_id, status)):
            return _err("filters must be strings")
        return _ok([{"enrollment_id": k, **e} for k, e in self.enrollments.items()
                    if (not student_id or e["student_id"] == student_id) and (not course_id or e["course_id"] == course_id)
                    and (not status or e["status"] == status)])

    def update_student_email(self, student_id: str, email: str):
        if bad := _bad_str(student_id=student_id, email=email):
            return bad
        if student_id not in self.students:
            return _err(f"unknown student {student_id!r}")
        if "@" not in email:
            return _err("invalid email address")
        self.students[student_id]["email"] = email
        return _ok({"student_id": student_id, "email": email})

    def enroll_student(self, student_id: str, course_id: str):
        """Enroll an active student in an open course with a free seat; returns the enrollment id."""
        if bad := _bad_str(student_id=student_id, course_id=course_id):
            return bad
        if problem := self._seat_problem(student_id, course_id):
            return _err(problem)
        eid = _new_id(self.enrollments, "EN")
        self.enrollments[eid] = {"student_id": student_id, "course_id": course_id, "status": "enrolled"}
        return _ok({"enrollment_id": eid})

    def transfer_enrollment(self, enrollment_id: str, course_id: str):
        """Move an active enrollment to another course the student may take."""
        if bad := _bad_str(enrollment_id=enrollment_id, course_id=course_id):
            return bad
        enrollment = self.enrollments.get(enrollment_id)
        if enrollment is None or enrollment["status"] != "enrolled":
            return _err(f"{enrollment_id!r} is not an active enrollment")
        if problem := self._seat_problem(enrollment["student_id"], course_id):
            return _err(problem)
        enrollment["course_id"] = course_id
        return _ok({"enrollment_id": enrollment_id, "course_id": course_id})

    def drop_enrollment(self, enrollment_id: str):
        if bad := _bad_str(enrollment_id=enrollment_id):
            return bad
        enrollment = self.enrollments.get(enrollment_id)
        if enrollment is None or enrollment["status"] != "enrolled":
            return _err(f"{enrollment_id!r} is not an active enrollment")
        enrollment["status"] = "dropped"
        return _ok({"enrollment_id": enrollment_id, "status": "dropped"})

    def find_staff_by_name(self, name: str):
        if bad := _bad_str(name=name):
            return bad
        hits = [{"staff_id": k, **s} for k, s in self.staff.items() if s["name"].lower() == name.strip().lower()]
        return _ok(hits) if hits else _err(f"no staff member named {name!r}")

    def delete_student(self, student_id: str, staff_id: str):
        """Registrars delete a student with no active enrollments."""
        if bad := _bad_str(student_id=student_id, staff_id=staff_id):
            return bad
        if self.staff.get(staff_id, {}).get("role") != "registrar":
            return _err("permission denied: only a registrar can delete students")
        if student_id not in self.students:
            return _err(f"unknown student {student_id!r}")
        if any(e["student_id"] == student_id and e["status"] == "enrolled" for e in self.enrollments.values()):
            return _err("student still has active enrollments")
        del self.students[student_id]
        self.audit_log.append({"op": "delete_student", "actor": staff_id, "target": student_id})
        return _ok({"deleted": student_id})
