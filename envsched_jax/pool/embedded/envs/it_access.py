"""IT access management and help-desk ticketing: user accounts and support tickets."""


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


class ITAccessManagement:
    def __init__(self, init_config):
        cfg = init_config or {}
        self.accounts = cfg.get("accounts", {})    # U001 -> {name, email, department, role, status, ticket_limit}
        self.tickets = cfg.get("tickets", {})      # T001 -> {requester_id, subject, priority, status, assignee_id, resolution}
        self.audit_log = cfg.get("audit_log", [])  # [{op, actor, target}]

    def _actor_role(self, actor_id):
        actor = self.accounts.get(actor_id)
        return actor["role"] if actor and actor["status"] == "active" else None

    def find_account_by_name(self, name: str):
        if bad := _bad_str(name=name):
            return bad
        hits = [{"user_id": k, **a} for k, a in self.accounts.items() if a["name"].lower() == name.strip().lower()]
        return _ok(hits) if hits else _err(f"no account named {name!r}")

    def get_ticket(self, ticket_id: str):
        if bad := _bad_str(ticket_id=ticket_id):
            return bad
        if ticket_id not in self.tickets:
            return _err(f"unknown ticket {ticket_id!r}")
        return _ok({"ticket_id": ticket_id, **self.tickets[ticket_id]})

    def list_tickets(self, status: str = "", assignee_id: str = "", requester_id: str = ""):
        if not all(isinstance(v, str) for v in (status, assignee_id, requester_id)):
            return _err("filters must be strings")
        return _ok([{"ticket_id": k, **t} for k, t in self.tickets.items()
                    if (not status or t["status"] == status) and (not assignee_id or t["assignee_id"] == assignee_id)
                    and (not requester_id or t["requester_id"] == requester_id)])

    def update_account_email(self, user_id: str, email: str):
        if bad := _bad_str(user_id=user_id, email=email):
            return bad
        if user_id not in self.accounts:
            return _err(f"unknown account {user_id!r}")
        if "@" not in email:
            return _err("invalid email address")
        self.accounts[user_id]["email"] = email
        return _ok({"user_id": user_id, "email": email})

    def assign_ticket(self, ticket_id: str, assignee_id: str):
        """Assign an open ticket to an active help-desk technician below their open-ticket limit."""
        if bad := _bad_str(ticket_id=ticket_id, assignee_id=assignee_id):
            return bad
        ticket = self.tickets.get(ticket_id)
        if ticket is None or ticket["status"] != "open":
            return _err(f"{ticket_id!r} is not an open ticket")
        if self._actor_role(assignee_id) != "helpdesk":
            return _err(f"{assignee_id!r} is not an active help-desk technician")
        load = sum(t["assignee_id"] == assignee_id and t["status"] == "open" for t in self.tickets.values())
        if load >= self.accounts[assignee_id].get("ticket_limit", 0):
            return _err(f"{assignee_id} already has {load} open tickets")
        ticket["assignee_id"] = assignee_id
        return _ok({"ticket_id": ticket_id, "assignee_id": assignee_id})

    def create_ticket(self, requester_id: str, subject: str, priority: str = "normal"):
        if bad := _bad_str(requester_id=requester_id, subject=subject, priority=priority):
            return bad
        if priority not in ("low", "normal", "high"):
            return _err("priority must be low, normal or high")
        if self.accounts.get(requester_id, {}).get("status") != "active":
            return _err(f"{requester_id!r} is not an active account")
        tid = _new_id(self.tickets, "T")
        self.tickets[tid] = {"requester_id": requester_id, "subject": subject, "priority": priority,
                             "status": "open", "assignee_id": None, "resolution": ""}
        return _ok({"ticket_id": tid})

    def close_ticket(self, ticket_id: str, resolution: str):
        if bad := _bad_str(ticket_id=ticket_id, resolution=resolution):
            return bad
        ticket = self.tickets.get(ticket_id)
        if ticket is None or ticket["status"] != "open":
            return _err(f"{ticket_id!r} is not an open ticket")
        ticket.update(status="closed", resolution=resolution)
        return _ok({"ticket_id": ticket_id, "status": "closed"})

    def disable_account(self, user_id: str, actor_id: str):
        """Help-desk staff or admins disable an active account."""
        if bad := _bad_str(user_id=user_id, actor_id=actor_id):
            return bad
        if self._actor_role(actor_id) not in ("helpdesk", "admin"):
            return _err("permission denied: only help-desk staff or admins can disable accounts")
        account = self.accounts.get(user_id)
        if account is None or account["status"] != "active":
            return _err(f"{user_id!r} is not an active account")
        account["status"] = "disabled"
        self.audit_log.append({"op": "disable_account", "actor": actor_id, "target": user_id})
        return _ok({"user_id": user_id, "status": "disabled"})

    def delete_account(self, user_id: str, actor_id: str):
        """Admins delete a disabled account."""
        if bad := _bad_str(user_id=user_id, actor_id=actor_id):
            return bad
        if self._actor_role(actor_id) != "admin":
            return _err("permission denied: only admins can delete accounts")
        account = self.accounts.get(user_id)
        if account is None:
            return _err(f"unknown account {user_id!r}")
        if account["status"] != "disabled":
            return _err("only disabled accounts can be deleted")
        del self.accounts[user_id]
        self.audit_log.append({"op": "delete_account", "actor": actor_id, "target": user_id})
        return _ok({"deleted": user_id})
