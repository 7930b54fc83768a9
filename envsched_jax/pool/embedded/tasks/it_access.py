"""IT access management and ticketing: metadata and task builders."""

from __future__ import annotations

import copy

from envsched_jax.pool.embedded._spec import (TaskSpec, add_bystanders, absent, act, field_eq, logged, new_records,
                                              others_unchanged, reply, unchanged, where_eq)
from envsched_jax.pool.embedded.envs.it_access import ITAccessManagement

ENV_ID = "it_access"
CLASS = ITAccessManagement
SUMMARY = ("A company's IT help desk and account directory. Accounts have a role (user, helpdesk, "
           "admin) and a status; help-desk technicians work tickets up to a personal open-ticket "
           "limit. Active users can file tickets (generated ids), open tickets can be assigned to an "
           "active technician with spare capacity or closed with a resolution. Help-desk staff and "
           "admins can disable accounts; only admins can delete an account, and only a disabled one.")
STATE_SPACE = (
    {"entity": "Account", "attributes": "user_id, name, email, department, role (user|helpdesk|admin), status (active|disabled), ticket_limit",
     "description": "A directory account; ticket_limit applies to help-desk technicians."},
    {"entity": "Ticket", "attributes": "ticket_id, requester_id, subject, priority, status (open|closed), assignee_id, resolution",
     "description": "A support request."},
    {"entity": "AuditLog", "attributes": "op, actor, target", "description": "Privileged actions."},
)
CONSTRAINTS = (
    "Tickets can only be assigned to active accounts with role helpdesk.",
    "A technician may hold at most ticket_limit open tickets.",
    "Only active accounts can file tickets.",
    "Only open tickets can be assigned or closed.",
    "Only active helpdesk or admin accounts can disable an account.",
    "Only active admins can delete an account, and only a disabled one.",
)
TOOL_DOCS = {
    "find_account_by_name": ("query", "Find accounts by full name; returns ids, roles and statuses.", {"name": "Full name"}),
    "get_ticket": ("query", "Get one ticket by id.", {"ticket_id": "Ticket id, e.g. T001"}),
    "list_tickets": ("query", "List tickets filtered by status, assignee and requester.",
                     {"status": "Optional status (open or closed)", "assignee_id": "Optional assignee user id",
                      "requester_id": "Optional requester user id"}),
    "update_account_email": ("state_change", "Change an account's email.", {"user_id": "User id", "email": "New email"}),
    "assign_ticket": ("state_change", "Assign an open ticket to a help-desk technician.",
                      {"ticket_id": "Ticket id", "assignee_id": "Technician's user id"}),
    "create_ticket": ("state_change", "File a new ticket for a requester; returns the ticket id.",
                      {"requester_id": "Requester's user id", "subject": "Short subject", "priority": "low, normal or high"}),
    "close_ticket": ("state_change", "Close an open ticket with a resolution.", {"ticket_id": "Ticket id", "resolution": "Resolution text"}),
    "disable_account": ("state_change", "Disable an active account (help desk or admin).",
                        {"user_id": "Account to disable", "actor_id": "Id of the acting help-desk or admin account"}),
    "delete_account": ("state_change", "Delete a disabled account (admins only).",
                       {"user_id": "Account to delete", "actor_id": "Id of the acting admin"}),
}

_BASE = {
    "accounts": {
        "U001": {"name": "Hana Sato", "email": "hana@corp.test", "department": "Finance", "role": "user", "status": "active", "ticket_limit": 0},
        "U002": {"name": "Igor Petrov", "email": "igor@corp.test", "department": "Sales", "role": "user", "status": "active", "ticket_limit": 0},
        "U003": {"name": "Julia Meyer", "email": "julia@corp.test", "department": "IT", "role": "helpdesk", "status": "active", "ticket_limit": 2},
        "U004": {"name": "Karl Weber", "email": "karl@corp.test", "department": "IT", "role": "helpdesk", "status": "active", "ticket_limit": 3},
        "U005": {"name": "Lina Costa", "email": "lina@corp.test", "department": "IT", "role": "admin", "status": "active", "ticket_limit": 0},
        "U006": {"name": "Marco Rossi", "email": "marco@corp.test", "department": "Sales", "role": "user", "status": "disabled", "ticket_limit": 0},
        "U007": {"name": "Nina Holm", "email": "nina@corp.test", "department": "IT", "role": "helpdesk", "status": "disabled", "ticket_limit": 2},
    },
    "tickets": {
        "T001": {"requester_id": "U001", "subject": "VPN not connecting", "priority": "high", "status": "open", "assignee_id": "U003", "resolution": ""},
        "T002": {"requester_id": "U002", "subject": "Password reset", "priority": "normal", "status": "open", "assignee_id": "U003", "resolution": ""},
        "T003": {"requester_id": "U001", "subject": "New monitor", "priority": "low", "status": "open", "assignee_id": None, "resolution": ""},
        "T004": {"requester_id": "U002", "subject": "Printer jam", "priority": "normal", "status": "closed", "assignee_id": "U004", "resolution": "cleared"},
        "T005": {"requester_id": "U006", "subject": "Mailbox full", "priority": "low", "status": "open", "assignee_id": "U004", "resolution": ""},
    },
    "audit_log": [],
}
_N = {k: a["name"] for k, a in _BASE["accounts"].items()}


def _state():
    return copy.deepcopy(_BASE)


def _lookup_update():
    out = []
    for uid, email, text in [
        ("U001", "hana.sato@corp.test", "Hana Sato got a new alias: hana.sato@corp.test. Make it her account email."),
        ("U002", "i.petrov@corp.test", "Change Igor Petrov's email to i.petrov@corp.test."),
        ("U004", "karl.weber@corp.test", "Please update the directory: Karl Weber -> karl.weber@corp.test."),
        ("U006", "m.rossi@corp.test", "Set Marco Rossi's email to m.rossi@corp.test for the archive."),
    ]:
        out.append(TaskSpec(
            text, _state(),
            [field_eq(f"{_N[uid]}'s email is {email}", ["accounts", uid, "email"], email),
             unchanged(f"{_N[uid]}'s status is unchanged", ["accounts", uid, "status"]),
             others_unchanged("no other account changed", "accounts", [uid]),
             unchanged("tickets are unchanged", ["tickets"])],
            [act("find_account_by_name", name=_N[uid]), act("update_account_email", user_id=uid, email=email),
             reply(f"Email updated for {_N[uid]}.")],
            "lookup_update",
            wrong=[[act("update_account_email", user_id="U002", email=email), reply("done")]] if uid == "U001" else []))
    return out


def _reassign():
    out = []
    for tid, to, fallback in [("T003", "U004", None), ("T001", "U004", None), ("T003", "U003", "U004"), ("T005", "U007", "close")]:
        s = _state()
        subj = s["tickets"][tid]["subject"]
        look = [act("get_ticket", ticket_id=tid), act("find_account_by_name", name=_N[to]),
                act("list_tickets", status="open", assignee_id=to)]
        if fallback is None:
            text = f"Assign ticket {tid} ('{subj}') to {_N[to]}."
            checks = [field_eq(f"{tid} is assigned to {to}", ["tickets", tid, "assignee_id"], to),
                      field_eq(f"{tid} stays open", ["tickets", tid, "status"], "open"),
                      others_unchanged("no other ticket changed", "tickets", [tid])]
            out.append(TaskSpec(text, s, checks, look + [act("assign_ticket", ticket_id=tid, assignee_id=to),
                                                        reply(f"{tid} assigned to {_N[to]}.")], "reassign_gated"))
        elif fallback == "close":
            text = (f"Give ticket {tid} to {_N[to]}. If she can't take tickets, leave it with its current "
                    f"assignee and close it with the resolution 'archived old mail'.")
            checks = [field_eq(f"{tid} keeps its assignee", ["tickets", tid, "assignee_id"], s["tickets"][tid]["assignee_id"]),
                      field_eq(f"{tid} is closed", ["tickets", tid, "status"], "closed"),
                      field_eq("resolution recorded", ["tickets", tid, "resolution"], "archived old mail"),
                      unchanged(f"{_N[to]}'s account is unchanged", ["accounts", to])]
            actions = look + [act("close_ticket", ticket_id=tid, resolution="archived old mail"),
                              reply(f"{_N[to]} is disabled; {tid} closed.")]
            out.append(TaskSpec(text, s, checks, actions, "reassign_gated", "fail"))
        else:
            text = f"Route {tid} ('{subj}') to {_N[to]}, or to {_N[fallback]} if {_N[to]} has no capacity left."
            checks = [field_eq(f"{tid} is assigned to {fallback}", ["tickets", tid, "assignee_id"], fallback),
                      others_unchanged("no other ticket changed", "tickets", [tid]),
                      unchanged("accounts unchanged", ["accounts"])]
            actions = look + [act("find_account_by_name", name=_N[fallback]),
                              act("assign_ticket", ticket_id=tid, assignee_id=fallback),
                              reply(f"{_N[to]} is full; assigned to {_N[fallback]}.")]
            out.append(TaskSpec(text, s, checks, actions, "reassign_gated", "fail",
                                wrong=[[act("assign_ticket", ticket_id=tid, assignee_id=to), reply("done")]]))
    return out


def _create():
    out = []
    for uid, subject, prio, alt in [("U001", "Laptop battery swelling", "high", None), ("U002", "CRM access", "normal", None),
                                    ("U004", "Replace keyboard", "low", None), ("U006", "Restore shared drive", "normal", "U002")]:
        s = _state()
        made = alt or uid
        text = f"Open a {prio}-priority ticket '{subject}' for {_N[uid]}."
        if alt:
            text += f" If {_N[uid]}'s account can't file tickets, file it under their manager {_N[alt]}."
        checks = [new_records(f"a new open ticket '{subject}' from {made}", "tickets",
                              {"requester_id": made, "subject": subject, "priority": prio, "status": "open"}),
                  others_unchanged("existing tickets unchanged", "tickets", []),
                  unchanged("accounts unchanged", ["accounts"])]
        actions = [act("find_account_by_name", name=_N[uid])] + ([act("find_account_by_name", name=_N[alt])] if alt else [])
        actions += [act("create_ticket", requester_id=made, subject=subject, priority=prio), reply("Ticket filed.")]
        out.append(TaskSpec(text, s, checks, actions, "create_gated", "fail" if alt else "pass"))
    return out


def _delete():
    out = []
    for uid, actor, boss in [("U006", "U005", None), ("U007", "U003", "U005"), ("U007", "U005", None), ("U006", "U004", "U005")]:
        if boss is None:
            text, by = f"{_N[actor]} here (admin). Remove {_N[uid]}'s disabled account from the directory.", actor
            actions = [act("find_account_by_name", name=_N[actor]), act("find_account_by_name", name=_N[uid]),
                       act("delete_account", user_id=uid, actor_id=actor)]
            wrong = []
        else:
            text = (f"{_N[actor]} asked us to delete {_N[uid]}'s account. If {_N[actor]} does not have the rights, "
                    f"perform it as {_N[boss]}.")
            by = boss
            actions = [act("find_account_by_name", name=_N[actor]), act("find_account_by_name", name=_N[boss]),
                       act("find_account_by_name", name=_N[uid]), act("delete_account", user_id=uid, actor_id=boss)]
            wrong = [[act("delete_account", user_id=uid, actor_id=actor), reply("done")]]
        checks = [absent(f"{_N[uid]}'s account is deleted", "accounts", uid),
                  logged(f"deleted by {by}", "delete_account", by, uid),
                  others_unchanged("no other account changed", "accounts", [uid])]
        out.append(TaskSpec(text, _state(), checks, actions + [reply("Account deleted.")],
                            "authorized_delete", "pass" if boss is None else "fail", wrong=wrong))
    return out


def _multi_step():
    out = []
    for uid, actor in [("U001", "U003"), ("U002", "U005"), ("U001", "U004"), ("U002", "U003")]:
        s = _state()
        subject = f"Collect laptop from {_N[uid]}"
        text = (f"{_N[uid]} is leaving the company. Acting as {_N[actor]}, disable the account, then file a "
                f"normal-priority ticket '{subject}' under your own name and assign it to yourself, or to "
                f"Karl Weber if you can't take more tickets.")
        limit = s["accounts"][actor]["ticket_limit"] if s["accounts"][actor]["role"] == "helpdesk" else 0
        load = sum(t["assignee_id"] == actor and t["status"] == "open" for t in s["tickets"].values())
        assignee = actor if load < limit else "U004"
        checks = [field_eq(f"{_N[uid]}'s account is disabled", ["accounts", uid, "status"], "disabled"),
                  logged(f"disabled by {actor}", "disable_account", actor, uid),
                  new_records(f"a ticket '{subject}' assigned to {assignee}", "tickets",
                              {"requester_id": actor, "subject": subject, "status": "open", "assignee_id": assignee})]
        actions = [act("find_account_by_name", name=_N[uid]), act("find_account_by_name", name=_N[actor]),
                   act("disable_account", user_id=uid, actor_id=actor),
                   act("create_ticket", requester_id=actor, subject=subject, priority="normal"),
                   act("list_tickets", status="open", assignee_id=actor)]
        if assignee != actor:
            actions.append(act("find_account_by_name", name=_N[assignee]))
        actions += [act("assign_ticket", ticket_id="T006", assignee_id=assignee), reply("Offboarding started.")]
        out.append(TaskSpec(text, s, checks, actions, "multi_step",
                            wrong=[[act("disable_account", user_id=uid, actor_id=uid), reply("done")]]))
    return out


def _bulk():
    out = []
    for key, value, text in [("requester_id", "U001", "Hana Sato says all her issues are fixed: close every open ticket she filed with resolution 'resolved'."),
                             ("assignee_id", "U003", "Julia Meyer is going on leave; close all open tickets assigned to her with resolution 'resolved'."),
                             ("assignee_id", "U004", "Close every open ticket in Karl Weber's queue, resolution 'resolved'."),
                             ("requester_id", "U002", "Igor Petrov's requests are all done. Close his open tickets with resolution 'resolved'.")]:
        s = _state()
        s["tickets"]["T006"] = {"requester_id": "U002", "subject": "Docking station", "priority": "low", "status": "open",
                                "assignee_id": "U004", "resolution": ""}
        ids = [k for k, t in s["tickets"].items() if t[key] == value and t["status"] == "open"]
        checks = [where_eq("every matching open ticket is closed", "tickets", {key: value, "status": "open"}, "status", "closed"),
                  where_eq("resolutions recorded", "tickets", {key: value, "status": "open"}, "resolution", "resolved"),
                  others_unchanged("no other ticket changed", "tickets", ids)]
        actions = [act("find_account_by_name", name=_N[value]), act("list_tickets", status="open", **{key: value})]
        actions += [act("close_ticket", ticket_id=k, resolution="resolved") for k in ids]
        out.append(TaskSpec(text, s, checks, actions + [reply(f"Closed {', '.join(ids)}.")], "filter_bulk_update"))
    return out


def build_tasks() -> list[TaskSpec]:
    tasks = _lookup_update() + _reassign() + _create() + _delete() + _multi_step() + _bulk()
    return add_bystanders(tasks, "accounts", "U", lambda name, k: {"name": name, "email": f"user{k}@corp.test", "department": "Operations", "role": "user", "status": "active", "ticket_limit": 0})
