"""Insurance policy administration: metadata and task builders."""

from __future__ import annotations

import copy

from envsched_jax.pool.embedded._spec import (TaskSpec, add_bystanders, absent, act, all_field_eq, field_eq, logged, new_records,
                                              others_unchanged, reply, unchanged)
from envsched_jax.pool.embedded.envs.insurance_policy import InsurancePolicyAdmin

ENV_ID = "insurance_policy"
CLASS = InsurancePolicyAdmin
SUMMARY = ("An insurer's policy administration back office. Customers hold auto, home and health "
           "policies, each managed by a sales agent who may manage only a limited number of "
           "policies. Claims (generated ids) can be filed on active policies up to the coverage "
           "limit; underwriters and managers approve or deny open claims, and only managers delete "
           "a denied claim.")
STATE_SPACE = (
    {"entity": "Customer", "attributes": "customer_id, name, email", "description": "A policy holder."},
    {"entity": "Policy", "attributes": "policy_id, customer_id, type, status (active|lapsed|cancelled), coverage_limit, agent_id",
     "description": "An insurance contract and the agent managing it."},
    {"entity": "Claim", "attributes": "claim_id, policy_id, amount, status (open|approved|denied)", "description": "A claim on a policy."},
    {"entity": "Agent", "attributes": "agent_id, name, role (agent|underwriter|manager), max_policies", "description": "Insurer staff."},
    {"entity": "AuditLog", "attributes": "op, actor, target", "description": "Privileged actions."},
)
CONSTRAINTS = (
    "A policy can only be managed by staff with role agent, each holding at most max_policies policies.",
    "Claims can only be filed on active policies, for a positive amount no larger than the coverage limit.",
    "Only underwriters and managers can approve or deny a claim, and only while it is open.",
    "Only managers can delete a claim, and only a denied one.",
)
TOOL_DOCS = {
    "find_customer_by_name": ("query", "Find customers by full name.", {"name": "Full name"}),
    "list_policies": ("query", "List policies filtered by customer and/or agent.",
                      {"customer_id": "Optional customer id", "agent_id": "Optional agent id"}),
    "list_claims": ("query", "List claims filtered by policy and/or status.",
                    {"policy_id": "Optional policy id", "status": "Optional status (open, approved, denied)"}),
    "update_customer_email": ("state_change", "Change a customer's email.", {"customer_id": "Customer id", "email": "New email"}),
    "reassign_policy_agent": ("state_change", "Hand a policy to another sales agent.", {"policy_id": "Policy id", "agent_id": "New agent id"}),
    "file_claim": ("state_change", "File a claim on an active policy; returns the claim id.", {"policy_id": "Policy id", "amount": "Claimed amount"}),
    "decide_claim": ("state_change", "Approve or deny an open claim (underwriters and managers).",
                     {"claim_id": "Claim id", "decision": "approved or denied", "agent_id": "Id of the deciding staff member"}),
    "find_agent_by_name": ("query", "Find staff by full name; returns ids and roles.", {"name": "Full name"}),
    "delete_claim": ("state_change", "Delete a denied claim (managers only).", {"claim_id": "Claim id", "agent_id": "Id of the acting manager"}),
}

_BASE = {
    "customers": {
        "C001": {"name": "Olga Ivanova", "email": "olga@mail.test"},
        "C002": {"name": "Pedro Alves", "email": "pedro@mail.test"},
        "C003": {"name": "Quinn Harper", "email": "quinn@mail.test"},
        "C004": {"name": "Rosa Delgado", "email": "rosa@mail.test"},
    },
    "policies": {
        "POL-1001": {"customer_id": "C001", "type": "auto", "status": "active", "coverage_limit": 20000, "agent_id": "A01"},
        "POL-1002": {"customer_id": "C001", "type": "home", "status": "active", "coverage_limit": 250000, "agent_id": "A02"},
        "POL-1003": {"customer_id": "C002", "type": "auto", "status": "lapsed", "coverage_limit": 15000, "agent_id": "A01"},
        "POL-1004": {"customer_id": "C003", "type": "health", "status": "active", "coverage_limit": 50000, "agent_id": "A02"},
        "POL-1005": {"customer_id": "C004", "type": "home", "status": "active", "coverage_limit": 300000, "agent_id": "A05"},
        "POL-1006": {"customer_id": "C002", "type": "health", "status": "active", "coverage_limit": 40000, "agent_id": "A05"},
    },
    "claims": {
        "CL001": {"policy_id": "POL-1001", "amount": 1200, "status": "open"},
        "CL002": {"policy_id": "POL-1002", "amount": 8000, "status": "open"},
        "CL003": {"policy_id": "POL-1004", "amount": 300, "status": "denied"},
        "CL004": {"policy_id": "POL-1005", "amount": 5000, "status": "approved"},
        "CL005": {"policy_id": "POL-1006", "amount": 700, "status": "open"},
        "CL006": {"policy_id": "POL-1001", "amount": 450, "status": "denied"},
    },
    "agents": {
        "A01": {"name": "Sam Fischer", "role": "agent", "max_policies": 3},
        "A02": {"name": "Tara Jones", "role": "agent", "max_policies": 2},
        "A03": {"name": "Uma Reddy", "role": "underwriter", "max_policies": 0},
        "A04": {"name": "Victor Lang", "role": "manager", "max_policies": 0},
        "A05": {"name": "Wendy Cho", "role": "agent", "max_policies": 3},
    },
    "audit_log": [],
}
_C = {k: c["name"] for k, c in _BASE["customers"].items()}
_A = {k: a["name"] for k, a in _BASE["agents"].items()}


def _state():
    return copy.deepcopy(_BASE)


def _owner(pid):
    return _C[_BASE["policies"][pid]["customer_id"]]


def _lookup_update():
    out = []
    for cid, email, text in [
        ("C001", "olga.ivanova@mail.test", "Olga Ivanova wants correspondence at olga.ivanova@mail.test."),
        ("C002", "p.alves@mail.test", "Update Pedro Alves's email to p.alves@mail.test."),
        ("C003", "quinn.h@mail.test", "Policy holder Quinn Harper has a new email, quinn.h@mail.test."),
        ("C004", "rosa.d@mail.test", "Change the email on file for Rosa Delgado to rosa.d@mail.test."),
    ]:
        out.append(TaskSpec(
            text, _state(),
            [field_eq(f"{_C[cid]}'s email is {email}", ["customers", cid, "email"], email),
             others_unchanged("no other customer changed", "customers", [cid]),
             unchanged("policies are unchanged", ["policies"])],
            [act("find_customer_by_name", name=_C[cid]), act("update_customer_email", customer_id=cid, email=email),
             reply(f"Email updated for {_C[cid]}.")],
            "lookup_update",
            wrong=[[act("update_customer_email", customer_id="C002", email=email), reply("done")]] if cid == "C001" else []))
    return out


def _reassign():
    out = []
    for pid, to, fallback in [("POL-1005", "A01", None), ("POL-1006", "A01", None), ("POL-1001", "A02", "A05"), ("POL-1002", "A03", "claim")]:
        s = _state()
        p = s["policies"][pid]
        who, kind = _owner(pid), p["type"]
        look = [act("find_customer_by_name", name=who), act("list_policies", customer_id=p["customer_id"]),
                act("find_agent_by_name", name=_A[to]), act("list_policies", agent_id=to)]
        if fallback is None:
            text = f"{_A[to]} will now manage {who}'s {kind} policy. Reassign it."
            checks = [field_eq(f"{pid} is managed by {to}", ["policies", pid, "agent_id"], to),
                      unchanged(f"{pid} status unchanged", ["policies", pid, "status"]),
                      others_unchanged("no other policy changed", "policies", [pid])]
            out.append(TaskSpec(text, s, checks, look + [act("reassign_policy_agent", policy_id=pid, agent_id=to),
                                                        reply(f"{pid} now with {_A[to]}.")], "reassign_gated"))
        elif fallback == "claim":
            text = (f"Move {who}'s {kind} policy to {_A[to]}. If she cannot manage policies, keep the current agent "
                    f"and instead have {_A[to]} approve the open claim on that policy.")
            checks = [unchanged(f"{pid} keeps its agent", ["policies", pid]),
                      field_eq("the open claim is approved", ["claims", "CL002", "status"], "approved"),
                      logged(f"approved by {to}", "decide_claim", to, "CL002")]
            actions = look + [act("list_claims", policy_id=pid, status="open"),
                              act("decide_claim", claim_id="CL002", decision="approved", agent_id=to),
                              reply("She is an underwriter; the policy stays, and CL002 is approved.")]
            out.append(TaskSpec(text, s, checks, actions, "reassign_gated", "fail"))
        else:
            text = f"Reassign {who}'s {kind} policy to {_A[to]}; if {_A[to]} is at capacity, give it to {_A[fallback]}."
            checks = [field_eq(f"{pid} is managed by {fallback}", ["policies", pid, "agent_id"], fallback),
                      others_unchanged("no other policy changed", "policies", [pid]),
                      unchanged("agents unchanged", ["agents"])]
            actions = look + [act("find_agent_by_name", name=_A[fallback]),
                              act("reassign_policy_agent", policy_id=pid, agent_id=fallback),
                              reply(f"{_A[to]} is full; {pid} went to {_A[fallback]}.")]
            out.append(TaskSpec(text, s, checks, actions, "reassign_gated", "fail",
                                wrong=[[act("reassign_policy_agent", policy_id=pid, agent_id=to), reply("done")]]))
    return out


def _create():
    out = []
    for pid, amount, filed in [("POL-1001", 900, 900), ("POL-1005", 12000, 12000), ("POL-1004", 2500, 2500), ("POL-1001", 30000, 20000)]:
        s = _state()
        who, kind = _owner(pid), s["policies"][pid]["type"]
        text = f"File a claim of {amount} on {who}'s {kind} policy."
        if amount != filed:
            text += " If that exceeds the coverage, file it for the full coverage limit instead."
        checks = [new_records(f"a new open claim of {filed} on {pid}", "claims", {"policy_id": pid, "amount": filed, "status": "open"}),
                  others_unchanged("existing claims unchanged", "claims", []),
                  unchanged("policies unchanged", ["policies"])]
        actions = [act("find_customer_by_name", name=who), act("list_policies", customer_id=s["policies"][pid]["customer_id"]),
                   act("file_claim", policy_id=pid, amount=filed), reply("Claim filed.")]
        out.append(TaskSpec(text, s, checks, actions, "create_gated", "fail" if amount != filed else "pass",
                            wrong=[[act("file_claim", policy_id="POL-1003", amount=filed), reply("done")]] if pid == "POL-1004" else []))
    return out


def _delete():
    out = []
    for cid, actor, boss in [("CL003", "A04", None), ("CL006", "A01", "A04"), ("CL006", "A04", None), ("CL003", "A03", "A04")]:
        if boss is None:
            text, by = f"Victor Lang speaking. Purge denied claim {cid}.", actor
            actions = [act("find_agent_by_name", name=_A[actor]), act("delete_claim", claim_id=cid, agent_id=actor)]
            wrong = []
        else:
            text = f"{_A[actor]} wants denied claim {cid} deleted. If {_A[actor]} is not allowed to, do it as {_A[boss]}."
            by = boss
            actions = [act("find_agent_by_name", name=_A[actor]), act("find_agent_by_name", name=_A[boss]),
                       act("delete_claim", claim_id=cid, agent_id=boss)]
            wrong = [[act("delete_claim", claim_id=cid, agent_id=actor), reply("done")]]
        checks = [absent(f"{cid} is deleted", "claims", cid), logged(f"deleted by {by}", "delete_claim", by, cid),
                  others_unchanged("no other claim changed", "claims", [cid])]
        out.append(TaskSpec(text, _state(), checks, actions + [reply(f"{cid} deleted.")],
                            "authorized_delete", "pass" if boss is None else "fail", wrong=wrong))
    return out


def _multi_step():
    out = []
    for pid, amount, decider, decision in [("POL-1004", 4200, "A03", "approved"), ("POL-1006", 1500, "A04", "approved"),
                                           ("POL-1002", 9000, "A03", "denied"), ("POL-1005", 650, "A04", "denied")]:
        s = _state()
        who, kind = _owner(pid), s["policies"][pid]["type"]
        verb = "approve" if decision == "approved" else "deny"
        text = f"Register a {amount} claim on {who}'s {kind} policy, then, acting as {_A[decider]}, {verb} it."
        checks = [new_records(f"a {decision} claim of {amount} on {pid}", "claims", {"policy_id": pid, "amount": amount, "status": decision}),
                  logged(f"decided by {decider}", "decide_claim", decider, "CL007"),
                  others_unchanged("existing claims unchanged", "claims", ["CL007"])]
        actions = [act("find_customer_by_name", name=who), act("list_policies", customer_id=s["policies"][pid]["customer_id"]),
                   act("file_claim", policy_id=pid, amount=amount), act("find_agent_by_name", name=_A[decider]),
                   act("decide_claim", claim_id="CL007", decision=decision, agent_id=decider), reply(f"Claim CL007 {decision}.")]
        out.append(TaskSpec(text, s, checks, actions, "multi_step",
                            wrong=[[act("file_claim", policy_id=pid, amount=amount),
                                    act("decide_claim", claim_id="CL007", decision=decision, agent_id="A01"), reply("done")]]))
    return out


def _bulk():
    out = []
    for pids, decision, text in [(["POL-1001", "POL-1002"], "approved", "As underwriter Uma Reddy, approve every open claim on Olga Ivanova's policies."),
                                 (["POL-1006"], "denied", "Uma Reddy here: deny all open claims on policy POL-1006."),
                                 (["POL-1001"], "denied", "Acting as Uma Reddy, deny every open claim on policy POL-1001."),
                                 (["POL-1005", "POL-1006"], "approved", "Uma Reddy approves all open claims managed by agent Wendy Cho.")]:
        s = _state()
        s["claims"]["CL007"] = {"policy_id": pids[-1], "amount": 250, "status": "open"}
        ids = [k for k, c in s["claims"].items() if c["policy_id"] in pids and c["status"] == "open"]
        checks = [all_field_eq(f"claims {', '.join(ids)} are {decision}", "claims", ids, "status", decision), others_unchanged("no other claim changed", "claims", ids),
                  logged("decided by Uma Reddy", "decide_claim", "A03", ids[0])]
        if "Olga" in text:
            actions = [act("find_customer_by_name", name="Olga Ivanova"), act("list_policies", customer_id="C001")]
        elif "Wendy" in text:
            actions = [act("find_agent_by_name", name="Wendy Cho"), act("list_policies", agent_id="A05")]
        else:
            actions = []
        actions = [act("find_agent_by_name", name="Uma Reddy")] + actions
        actions += [act("list_claims", policy_id=p, status="open") for p in pids]
        actions += [act("decide_claim", claim_id=k, decision=decision, agent_id="A03") for k in ids]
        out.append(TaskSpec(text, s, checks, actions + [reply(f"{decision.capitalize()}: {', '.join(ids)}.")], "filter_bulk_update"))
    return out


def build_tasks() -> list[TaskSpec]:
    tasks = _lookup_update() + _reassign() + _create() + _delete() + _multi_step() + _bulk()
    return add_bystanders(tasks, "customers", "C", lambda name, k: {"name": name, "email": f"client{k}@mail.test"})
