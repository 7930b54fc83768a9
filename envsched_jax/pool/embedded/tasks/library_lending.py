"""Library lending: metadata and task builders."""

from __future__ import annotations

import copy

from envsched_jax.pool.embedded._spec import (TaskSpec, add_bystanders, absent, act, field_eq, logged, new_records,
                                              others_unchanged, reply, unchanged, where_eq)
from envsched_jax.pool.embedded.envs.library_lending import LibraryLending

ENV_ID = "library_lending"
CLASS = LibraryLending
SUMMARY = ("A public library's lending desk. Members borrow books up to a personal loan limit while "
           "their account is active; each checkout creates a loan with a generated id and takes one "
           "available copy, and returning a loan puts the copy back. Active loans can be handed over "
           "to another member who may still borrow. Only librarians (not clerks) may delete a "
           "member, and only one without active loans.")
STATE_SPACE = (
    {"entity": "Member", "attributes": "member_id, name, email, status (active|suspended), max_loans",
     "description": "A library card holder."},
    {"entity": "Book", "attributes": "book_id, title, author, copies_available",
     "description": "A title in the catalog and how many copies are on the shelf."},
    {"entity": "Loan", "attributes": "loan_id, member_id, book_id, status (active|returned)",
     "description": "One copy lent to one member."},
    {"entity": "Staff", "attributes": "staff_id, name, role (clerk|librarian)",
     "description": "Library employees."},
    {"entity": "AuditLog", "attributes": "op, actor, target", "description": "Privileged actions."},
)
CONSTRAINTS = (
    "Only active members can borrow or receive a transferred loan.",
    "A member's number of active loans may not exceed max_loans.",
    "A book can be checked out only when copies_available is at least 1.",
    "Returning a loan increases the book's copies_available by one.",
    "Only staff with role librarian can delete a member, and only when the member has no active loans.",
)
TOOL_DOCS = {
    "find_member_by_name": ("query", "Find members by full name; returns ids and records.", {"name": "Member's full name"}),
    "search_books": ("query", "Search the catalog by (part of) a title.", {"title": "Title or part of it"}),
    "list_loans": ("query", "List loans, optionally filtered by member, book and status.",
                   {"member_id": "Optional member id", "book_id": "Optional book id", "status": "Optional status (active or returned)"}),
    "update_member_email": ("state_change", "Change a member's email address.", {"member_id": "Member id", "email": "New email"}),
    "checkout_book": ("state_change", "Lend a book to a member; returns the new loan id.",
                      {"member_id": "Member id", "book_id": "Book id"}),
    "return_loan": ("state_change", "Mark an active loan as returned.", {"loan_id": "Loan id"}),
    "transfer_loan": ("state_change", "Hand an active loan over to another member.",
                      {"loan_id": "Loan id", "member_id": "Id of the member taking over the loan"}),
    "find_staff_by_name": ("query", "Find staff by full name; returns ids and roles.", {"name": "Staff member's full name"}),
    "delete_member": ("state_change", "Delete a member without active loans (librarians only).",
                      {"member_id": "Member id", "staff_id": "Id of the acting librarian"}),
}

_BASE = {
    "members": {
        "M001": {"name": "Alice Moreau", "email": "alice@mail.test", "status": "active", "max_loans": 3},
        "M002": {"name": "Bruno Silva", "email": "bruno@mail.test", "status": "active", "max_loans": 2},
        "M003": {"name": "Chloe Park", "email": "chloe@mail.test", "status": "suspended", "max_loans": 3},
        "M004": {"name": "Dev Sharma", "email": "dev@mail.test", "status": "active", "max_loans": 1},
        "M005": {"name": "Emma Stone", "email": "emma@mail.test", "status": "active", "max_loans": 3},
        "M006": {"name": "Farid Aziz", "email": "farid@mail.test", "status": "active", "max_loans": 2},
    },
    "books": {
        "BK01": {"title": "Dune", "author": "Frank Herbert", "copies_available": 2},
        "BK02": {"title": "Emma", "author": "Jane Austen", "copies_available": 0},
        "BK03": {"title": "Neuromancer", "author": "William Gibson", "copies_available": 1},
        "BK04": {"title": "Beloved", "author": "Toni Morrison", "copies_available": 3},
        "BK05": {"title": "Middlemarch", "author": "George Eliot", "copies_available": 1},
        "BK06": {"title": "Solaris", "author": "Stanislaw Lem", "copies_available": 0},
    },
    "loans": {
        "L001": {"member_id": "M001", "book_id": "BK02", "status": "active"},
        "L002": {"member_id": "M001", "book_id": "BK06", "status": "active"},
        "L003": {"member_id": "M002", "book_id": "BK01", "status": "active"},
        "L004": {"member_id": "M002", "book_id": "BK04", "status": "active"},
        "L005": {"member_id": "M004", "book_id": "BK03", "status": "active"},
        "L006": {"member_id": "M005", "book_id": "BK06", "status": "active"},
        "L007": {"member_id": "M003", "book_id": "BK05", "status": "returned"},
        "L008": {"member_id": "M001", "book_id": "BK04", "status": "returned"},
    },
    "staff": {
        "ST1": {"name": "Paula Reyes", "role": "librarian"},
        "ST2": {"name": "Ken Obi", "role": "clerk"},
        "ST3": {"name": "Rosa Lind", "role": "librarian"},
    },
    "audit_log": [],
}
_NAMES = {k: m["name"] for k, m in _BASE["members"].items()}
_TITLES = {k: b["title"] for k, b in _BASE["books"].items()}


def _state():
    return copy.deepcopy(_BASE)


def _lookup_update():
    out = []
    for mid, email, text in [
        ("M001", "a.moreau@post.test", "Alice Moreau changed providers; her email is now a.moreau@post.test."),
        ("M004", "dev.sharma@uni.test", "Please update Dev Sharma's email address to dev.sharma@uni.test."),
        ("M003", "chloe.p@mail.test", "Set the email on Chloe Park's account to chloe.p@mail.test."),
        ("M006", "farid.aziz@work.test", "Farid Aziz wants library notices sent to farid.aziz@work.test."),
    ]:
        name = _NAMES[mid]
        out.append(TaskSpec(
            text, _state(),
            [field_eq(f"{name}'s email is {email}", ["members", mid, "email"], email),
             unchanged(f"{name}'s status is unchanged", ["members", mid, "status"]),
             others_unchanged("no other member changed", "members", [mid]),
             unchanged("loans are unchanged", ["loans"])],
            [act("find_member_by_name", name=name), act("update_member_email", member_id=mid, email=email),
             reply(f"Updated {name}'s email to {email}.")],
            "lookup_update",
            wrong=[[act("update_member_email", member_id="M002", email=email), reply("done")]] if mid == "M001" else []))
    return out


def _reassign():
    out = []
    # (loan, from member, target member, fallback) ; fallback "return" means return the loan instead
    for lid, frm, to, fallback in [
        ("L001", "M001", "M006", None),
        ("L006", "M005", "M001", None),
        ("L002", "M001", "M002", "M006"),
        ("L003", "M002", "M004", "return"),
    ]:
        s = _state()
        title, a, b = _TITLES[s["loans"][lid]["book_id"]], _NAMES[frm], _NAMES[to]
        look = [act("find_member_by_name", name=a), act("list_loans", member_id=frm, status="active"),
                act("find_member_by_name", name=b), act("list_loans", member_id=to, status="active")]
        if fallback is None:
            text = f"{a} is passing their copy of {title} on to {b}. Transfer the loan."
            checks = [field_eq(f"the {title} loan belongs to {b}", ["loans", lid, "member_id"], to),
                      field_eq("the loan is still active", ["loans", lid, "status"], "active"),
                      others_unchanged("no other loan changed", "loans", [lid])]
            actions = look + [act("transfer_loan", loan_id=lid, member_id=to), reply(f"{title} now on {b}'s card.")]
            out.append(TaskSpec(text, s, checks, actions, "reassign_gated"))
        elif fallback == "return":
            text = (f"{a} wants to hand his {title} loan to {b}. If {b} cannot take on another loan, "
                    f"leave it on {a}'s card and simply check it back in.")
            checks = [field_eq(f"the {title} loan still belongs to {a}", ["loans", lid, "member_id"], frm),
                      field_eq("the loan is returned", ["loans", lid, "status"], "returned"),
                      unchanged(f"{b}'s loans are unchanged", ["loans", "L005"]),
                      field_eq(f"{title} has one more copy available", ["books", s["loans"][lid]["book_id"], "copies_available"],
                               s["books"][s["loans"][lid]["book_id"]]["copies_available"] + 1)]
            actions = look + [act("return_loan", loan_id=lid), reply(f"{b} is at the limit; {title} was returned.")]
            out.append(TaskSpec(text, s, checks, actions, "reassign_gated", "fail",
                                wrong=[[act("transfer_loan", loan_id=lid, member_id=to), reply("done")]]))
        else:
            c = _NAMES[fallback]
            text = f"Move {a}'s loan of {title} over to {b}; if {b} is already at the loan limit, give it to {c} instead."
            checks = [field_eq(f"the {title} loan belongs to {c}", ["loans", lid, "member_id"], fallback),
                      field_eq("the loan is still active", ["loans", lid, "status"], "active"),
                      others_unchanged("no other loan changed", "loans", [lid])]
            actions = look + [act("find_member_by_name", name=c), act("transfer_loan", loan_id=lid, member_id=fallback), reply(f"{b} is at the limit; gave it to {c}.")]
            out.append(TaskSpec(text, s, checks, actions, "reassign_gated", "fail",
                                wrong=[[act("transfer_loan", loan_id=lid, member_id=to), reply("done")]]))
    return out


def _loan_checks(mid, bid, s):
    return [new_records(f"a new active loan of {_TITLES[bid]} for {_NAMES[mid]}", "loans",
                        {"member_id": mid, "book_id": bid, "status": "active"}),
            field_eq(f"{_TITLES[bid]} has one copy fewer", ["books", bid, "copies_available"],
                     s["books"][bid]["copies_available"] - 1)]


def _create():
    out = []
    for mid, bid, text in [
        ("M006", "BK03", "Check out Neuromancer for Farid Aziz."),
        ("M005", "BK01", "Emma Stone would like to borrow Dune."),
        ("M001", "BK04", "Lend a copy of Beloved to Alice Moreau."),
        ("M003", "BK05", "Chloe Park wants to borrow Middlemarch. If her account does not allow borrowing, lend it to Farid Aziz, who is next on the hold list."),
    ]:
        s = _state()
        name, title = _NAMES[mid], _TITLES[bid]
        if mid == "M003":  # suspended: the checkout gate fails, the fallback borrower gets the book
            checks = _loan_checks("M006", bid, s) + [unchanged("Chloe Park's record is unchanged", ["members", "M003"])]
            actions = [act("find_member_by_name", name=name), act("search_books", title=title),
                       act("find_member_by_name", name="Farid Aziz"), act("checkout_book", member_id="M006", book_id=bid),
                       reply("Chloe's account is suspended, so Middlemarch went to Farid Aziz.")]
            out.append(TaskSpec(text, s, checks, actions, "create_gated", "fail"))
            continue
        checks = _loan_checks(mid, bid, s) + [others_unchanged("existing loans unchanged", "loans", [])]
        actions = [act("find_member_by_name", name=name), act("search_books", title=title),
                   act("checkout_book", member_id=mid, book_id=bid), reply(f"{title} checked out to {name}.")]
        out.append(TaskSpec(text, s, checks, actions, "create_gated"))
    return out


def _delete():
    out = []
    for mid, actor, actor_id, boss in [
        ("M003", "Paula Reyes", "ST1", None),
        ("M006", "Ken Obi", "ST2", ("Rosa Lind", "ST3")),
        ("M003", "Rosa Lind", "ST3", None),
        ("M006", "Ken Obi", "ST2", ("Paula Reyes", "ST1")),
    ]:
        name = _NAMES[mid]
        if boss is None:
            text, by = f"This is {actor}. Close and delete {name}'s library membership.", actor_id
            actions = [act("find_staff_by_name", name=actor), act("find_member_by_name", name=name),
                       act("list_loans", member_id=mid, status="active"), act("delete_member", member_id=mid, staff_id=actor_id)]
            wrong = []
        else:
            text = (f"{actor} at the desk asks to remove {name}'s membership. Clerks may not delete members; "
                    f"if that applies, have {boss[0]} do it.")
            by = boss[1]
            actions = [act("find_staff_by_name", name=actor), act("find_staff_by_name", name=boss[0]),
                       act("find_member_by_name", name=name), act("delete_member", member_id=mid, staff_id=by)]
            wrong = [[act("delete_member", member_id=mid, staff_id=actor_id), reply("done")]]
        checks = [absent(f"{name} is deleted", "members", mid),
                  logged(f"deleted by {by}", "delete_member", by, mid),
                  others_unchanged("no other member changed", "members", [mid])]
        out.append(TaskSpec(text, _state(), checks, actions + [reply(f"{name}'s membership was deleted.")],
                            "authorized_delete", "pass" if boss is None else "fail", wrong=wrong))
    return out


def _multi_step():
    out = []
    for mid, old_loan, bid in [("M002", "L004", "BK03"), ("M004", "L005", "BK01"),
                               ("M001", "L001", "BK05"), ("M005", "L006", "BK04")]:
        s = _state()
        if mid == "M001":
            s["members"]["M001"]["max_loans"] = 2
        name, old_title, title = _NAMES[mid], _TITLES[s["loans"][old_loan]["book_id"]], _TITLES[bid]
        text = f"{name} is bringing back {old_title} and wants to take out {title} today."
        checks = [field_eq(f"the {old_title} loan is returned", ["loans", old_loan, "status"], "returned")] + _loan_checks(mid, bid, s)
        actions = [act("find_member_by_name", name=name), act("list_loans", member_id=mid, status="active"),
                   act("return_loan", loan_id=old_loan), act("search_books", title=title),
                   act("checkout_book", member_id=mid, book_id=bid), reply(f"Returned {old_title}; {title} checked out.")]
        out.append(TaskSpec(text, s, checks, actions, "multi_step",
                            wrong=[[act("checkout_book", member_id=mid, book_id=bid), reply("done")]]))
    return out


def _bulk():
    out = []
    for key, value, text in [
        ("member_id", "M001", "Alice Moreau is moving away: check in every book she still has out."),
        ("member_id", "M002", "Return all of Bruno Silva's active loans."),
        ("book_id", "BK06", "All copies of Solaris are being recalled. Return every active Solaris loan."),
        ("book_id", "BK04", "Beloved is going to the bindery: check in every active loan of it."),
    ]:
        s = _state()
        if value == "BK04":
            s["loans"]["L009"] = {"member_id": "M005", "book_id": "BK04", "status": "active"}
        ids = [k for k, l in s["loans"].items() if l[key] == value and l["status"] == "active"]
        checks = [where_eq("every matching active loan is returned", "loans", {key: value, "status": "active"}, "status", "returned"),
                  others_unchanged("no other loan changed", "loans", ids),
                  unchanged("members are unchanged", ["members"])]
        actions = [act("find_member_by_name", name=_NAMES[value]) if key == "member_id" else act("search_books", title=_TITLES[value]),
                   act("list_loans", **{key: value, "status": "active"})]
        actions += [act("return_loan", loan_id=k) for k in ids]
        out.append(TaskSpec(text, s, checks, actions + [reply(f"Returned {', '.join(ids)}.")], "filter_bulk_update"))
    return out


def build_tasks() -> list[TaskSpec]:
    tasks = _lookup_update() + _reassign() + _create() + _delete() + _multi_step() + _bulk()
    return add_bystanders(tasks, "members", "M", lambda name, k: {"name": name, "email": f"reader{k}@mail.test", "status": "active", "max_loans": 2})
