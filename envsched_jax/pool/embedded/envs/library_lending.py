"""Library lending: members, books, loans and library staff."""


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


class LibraryLending:
    def __init__(self, init_config):
        cfg = init_config or {}
        self.members = cfg.get("members", {})      # M001 -> {name, email, status, max_loans}
        self.books = cfg.get("books", {})          # BK01 -> {title, author, copies_available}
        self.loans = cfg.get("loans", {})          # L001 -> {member_id, book_id, status}
        self.staff = cfg.get("staff", {})          # ST1 -> {name, role}
        self.audit_log = cfg.get("audit_log", [])  # [{op, actor, target}]

    def _active_loans(self, member_id):
        return [k for k, l in self.loans.items() if l["member_id"] == member_id and l["status"] == "active"]

    def find_member_by_name(self, name: str):
        if bad := _bad_str(name=name):
            return bad
        hits = [{"member_id": k, **m} for k, m in self.members.items() if m["name"].lower() == name.strip().lower()]
        return _ok(hits) if hits else _err(f"no member named {name!r}")

    def search_books(self, title: str):
        if bad := _bad_str(title=title):
            return bad
        hits = [{"book_id": k, **b} for k, b in self.books.items() if title.strip().lower() in b["title"].lower()]
        return _ok(hits) if hits else _err(f"no book matching {title!r}")

    def list_loans(self, member_id: str = "", book_id: str = "", status: str = ""):
        if not all(isinstance(v, str) for v in (member_id, book_id, status)):
            return _err("filters must be strings")
        return _ok([{"loan_id": k, **l} for k, l in self.loans.items()
                    if (not member_id or l["member_id"] == member_id) and (not book_id or l["book_id"] == book_id)
                    and (not status or l["status"] == status)])

    def update_member_email(self, member_id: str, email: str):
        if bad := _bad_str(member_id=member_id, email=email):
            return bad
        if member_id not in self.members:
            return _err(f"unknown member {member_id!r}")
        if "@" not in email:
            return _err("invalid email address")
        self.members[member_id]["email"] = email
        return _ok({"member_id": member_id, "email": email})

    def _can_borrow(self, member_id):
        member = self.members.get(member_id)
        if member is None:
            return f"unknown member {member_id!r}"
        if member["status"] != "active":
            return f"member {member_id} is {member['status']}"
        if len(self._active_loans(member_id)) >= member["max_loans"]:
            return f"member {member_id} is at the loan limit of {member['max_loans']}"
        return None

    def checkout_book(self, member_id: str, book_id: str):
        """Lend a book to an active member under their loan limit; returns the new loan id."""
        if bad := _bad_str(member_id=member_id, book_id=book_id):
            return bad
        if problem := self._can_borrow(member_id):
            return _err(problem)
        book = self.books.get(book_id)
        if book is None or book["copies_available"] < 1:
            return _err(f"no copy of {book_id!r} is available")
        book["copies_available"] -= 1
        lid = _new_id(self.loans, "L")
        self.loans[lid] = {"member_id": member_id, "book_id": book_id, "status": "active"}
        return _ok({"loan_id": lid})

    def return_loan(self, loan_id: str):
        if bad := _bad_str(loan_id=loan_id):
            return bad
        loan = self.loans.get(loan_id)
        if loan is None or loan["status"] != "active":
            return _err(f"{loan_id!r} is not an active loan")
        loan["status"] = "returned"
        if loan["book_id"] in self.books:
            self.books[loan["book_id"]]["copies_available"] += 1
        return _ok({"loan_id": loan_id, "status": "returned"})

    def transfer_loan(self, loan_id: str, member_id: str):
        """Hand an active loan over to another member who may borrow."""
        if bad := _bad_str(loan_id=loan_id, member_id=member_id):
            return bad
        loan = self.loans.get(loan_id)
        if loan is None or loan["status"] != "active":
            return _err(f"{loan_id!r} is not an active loan")
        if loan["member_id"] == member_id:
            return _err("the loan already belongs to this member")
        if problem := self._can_borrow(member_id):
            return _err(problem)
        loan["member_id"] = member_id
        return _ok({"loan_id": loan_id, "member_id": member_id})

    def find_staff_by_name(self, name: str):
        if bad := _bad_str(name=name):
            return bad
        hits = [{"staff_id": k, **s} for k, s in self.staff.items() if s["name"].lower() == name.strip().lower()]
        return _ok(hits) if hits else _err(f"no staff member named {name!r}")

    def delete_member(self, member_id: str, staff_id: str):
        """A librarian deletes a member who has no active loans."""
        if bad := _bad_str(member_id=member_id, staff_id=staff_id):
            return bad
        if self.staff.get(staff_id, {}).get("role") != "librarian":
            return _err("permission denied: only a librarian can delete members")
        if member_id not in self.members:
            return _err(f"unknown member {member_id!r}")
        if self._active_loans(member_id):
            return _err("member still has active loans")
        del self.members[member_id]
        self.audit_log.append({"op": "delete_member", "actor": staff_id, "target": member_id})
        return _ok({"deleted": member_id})
