"""Insurance policy administration: customers, policies, claims and agents."""


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


class InsurancePolicyAdmin:
    def __init__(self, init_config):
        cfg = init_config or {}
        self.customers = cfg.get("customers", {})  # C001 -> {name, email}
        self.policies = cfg.get("policies", {})    # POL-1001 -> {customer_id, type, status, coverage_limit, agent_id}
        self.claims = cfg.get("claims", {})        # CL001 -> {policy_id, amount, status}
        self.agents = cfg.get("agents", {})        # A01 -> {name, role, max_policies}
        self.audit_log = cfg.get("audit_log", [])  # [{op, actor, target}]

    def find_customer_by_name(self, name: str):
        if bad := _bad_str(name=name):
            return bad
        hits = [{"customer_id": k, **c} for k, c in self.customers.items() if c["name"].lower() == name.strip().lower()]
        return _ok(hits) if hits else _err(f"no customer named {name!r}")

    def list_policies(self, customer_id: str = "", agent_id: str = ""):
        if not isinstance(customer_id, str) or not isinstance(agent_id, str):
            return _err("filters must be strings")
        return _ok([{"policy_id": k, **p} for k, p in self.policies.items()
                    if (not customer_id or p["customer_id"] == customer_id) and (not agent_id or p["agent_id"] == agent_id)])

    def list_claims(self, policy_id: str = "", status: str = ""):
        if not isinstance(policy_id, str) or not isinstance(status, str):
            return _err("filters must be strings")
        return _ok([{"claim_id": k, **c} for k, c in self.claims.items()
                    if (not policy_id or c["policy_id"] == policy_id) and (not status or c["status"] == status)])

    def update_customer_email(self, customer_id: str, email: str):
        if bad := _bad_str(customer_id=customer_id, email=email):
            return bad
        if customer_id not in self.customers:
            return _err(f"unknown customer {customer_id!r}")
        if "@" not in email:
            return _err("invalid email address")
        self.customers[customer_id]["email"] = email
        return _ok({"customer_id": customer_id, "email": email})

    def reassign_policy_agent(self, policy_id: str, agent_id: str):
        """Hand a policy to a sales agent who is below their policy limit."""
        if bad := _bad_str(policy_id=policy_id, agent_id=agent_id):
            return bad
        policy, agent = self.policies.get(policy_id), self.agents.get(agent_id)
        if policy is None or agent is None:
            return _err("unknown policy or agent")
        if agent["role"] != "agent":
            return _err(f"{agent_id} is a {agent['role']}, not a sales agent")
        load = sum(p["agent_id"] == agent_id for p in self.policies.values())
        if load >= agent["max_policies"]:
            return _err(f"{agent_id} already manages {load} policies")
        policy["agent_id"] = agent_id
        return _ok({"policy_id": policy_id, "agent_id": agent_id})

    def file_claim(self, policy_id: str, amount: float):
        """File a claim on an active policy, up to its coverage limit; returns the claim id."""
        if bad := _bad_str(policy_id=policy_id):
            return bad
        if not isinstance(amount, (int, float)) or isinstance(amount, bool) or amount <= 0:
            return _err("amount must be a positive number")
        policy = self.policies.get(policy_id)
        if policy is None or policy["status"] != "active":
            return _err(f"{policy_id!r} is not an active policy")
        if amount > policy["coverage_limit"]:
            return _err(f"amount exceeds the coverage limit of {policy['coverage_limit']}")
        cid = _new_id(self.claims, "CL")
        self.claims[cid] = {"policy_id": policy_id, "amount": amount, "status": "open"}
        return _ok({"claim_id": cid})

    def decide_claim(self, claim_id: str, decision: str, agent_id: str):
        """Underwriters and managers approve or deny an open claim."""
        if bad := _bad_str(claim_id=claim_id, decision=decision, agent_id=agent_id):
            return bad
        if self.agents.get(agent_id, {}).get("role") not in ("underwriter", "manager"):
            return _err("permission denied: only underwriters or managers decide claims")
        if decision not in ("approved", "denied"):
            return _err("decision must be approved or denied")
        claim = self.claims.get(claim_id)
        if claim is None or claim["status"] != "open":
            return _err(f"{claim_id!r} is not an open claim")
        claim["status"] = decision
        self.audit_log.append({"op": "decide_claim", "actor": agent_id, "target": claim_id})
        return _ok({"claim_id": claim_id, "status": decision})

    def find_agent_by_name(self, name: str):
        if bad := _bad_str(name=name):
            return bad
        hits = [{"agent_id": k, **a} for k, a in self.agents.items() if a["name"].lower() == name.strip().lower()]
        return _ok(hits) if hits else _err(f"no agent named {name!r}")

    def delete_claim(self, claim_id: str, agent_id: str):
        """Managers delete a denied claim."""
        if bad := _bad_str(claim_id=claim_id, agent_id=agent_id):
            return bad
        if self.agents.get(agent_id, {}).get("role") != "manager":
            return _err("permission denied: only managers can delete claims")
        claim = self.claims.get(claim_id)
        if claim is None:
            return _err(f"unknown claim {claim_id!r}")
        if claim["status"] != "denied":
            return _err("only denied claims can be deleted")
        del self.claims[claim_id]
        self.audit_log.append({"op": "delete_claim", "actor": agent_id, "target": claim_id})
        return _ok({"deleted": claim_id})
