"""Warehouse inventory: products stored in bins, outbound orders and warehouse staff."""


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


class WarehouseInventory:
    def __init__(self, init_config):
        cfg = init_config or {}
        self.products = cfg.get("products", {})    # SKU-100 -> {name, bin_id, quantity, status}
        self.bins = cfg.get("bins", {})            # A-01 -> {zone, capacity, sku}
        self.orders = cfg.get("orders", {})        # O001 -> {sku, quantity, status}
        self.staff = cfg.get("staff", {})          # W1 -> {name, role}
        self.audit_log = cfg.get("audit_log", [])  # [{op, actor, target}]

    def find_product_by_name(self, name: str):
        if bad := _bad_str(name=name):
            return bad
        hits = [{"sku": k, **p} for k, p in self.products.items() if p["name"].lower() == name.strip().lower()]
        return _ok(hits) if hits else _err(f"no product named {name!r}")

    def get_bin(self, bin_id: str):
        if bad := _bad_str(bin_id=bin_id):
            return bad
        if bin_id not in self.bins:
            return _err(f"unknown bin {bin_id!r}")
        return _ok({"bin_id": bin_id, **self.bins[bin_id]})

    def list_bins(self, zone: str, empty_only: bool = False):
        if bad := _bad_str(zone=zone):
            return bad
        return _ok([{"bin_id": k, **b} for k, b in self.bins.items()
                    if b["zone"] == zone and not (empty_only is True and b["sku"] is not None)])

    def list_orders(self, sku: str = "", status: str = ""):
        if not isinstance(sku, str) or not isinstance(status, str):
            return _err("filters must be strings")
        return _ok([{"order_id": k, **o} for k, o in self.orders.items()
                    if (not sku or o["sku"] == sku) and (not status or o["status"] == status)])

    def set_stock_level(self, sku: str, quantity: int):
        """Record a counted stock level; it must fit the product's bin."""
        if bad := _bad_str(sku=sku):
            return bad
        if not isinstance(quantity, int) or isinstance(quantity, bool) or quantity < 0:
            return _err("quantity must be a non-negative integer")
        product = self.products.get(sku)
        if product is None:
            return _err(f"unknown product {sku!r}")
        if quantity > self.bins.get(product["bin_id"], {}).get("capacity", 0):
            return _err("quantity exceeds the capacity of the product's bin")
        product["quantity"] = quantity
        return _ok({"sku": sku, "quantity": quantity})

    def move_product(self, sku: str, bin_id: str):
        """Move a product's stock into an empty bin large enough to hold it."""
        if bad := _bad_str(sku=sku, bin_id=bin_id):
            return bad
        product, target = self.products.get(sku), self.bins.get(bin_id)
        if product is None or target is None:
            return _err("unknown product or bin")
        if target["sku"] is not None:
            return _err(f"bin {bin_id} already holds {target['sku']}")
        if target["capacity"] < product["quantity"]:
            return _err(f"bin {bin_id} holds {target['capacity']}, product has {product['quantity']}")
        if product["bin_id"] in self.bins:
            self.bins[product["bin_id"]]["sku"] = None
        target["sku"] = sku
        product["bin_id"] = bin_id
        return _ok({"sku": sku, "bin_id": bin_id})

    def create_order(self, sku: str, quantity: int):
        """Reserve stock of an active product for a new open order; returns the order id."""
        if bad := _bad_str(sku=sku):
            return bad
        if not isinstance(quantity, int) or isinstance(quantity, bool) or quantity < 1:
            return _err("quantity must be a positive integer")
        product = self.products.get(sku)
        if product is None or product["status"] != "active":
            return _err(f"{sku!r} is not an active product")
        if product["quantity"] < quantity:
            return _err(f"only {product['quantity']} units of {sku} in stock")
        product["quantity"] -= quantity
        oid = _new_id(self.orders, "O")
        self.orders[oid] = {"sku": sku, "quantity": quantity, "status": "open"}
        return _ok({"order_id": oid})

    def ship_order(self, order_id: str):
        if bad := _bad_str(order_id=order_id):
            return bad
        order = self.orders.get(order_id)
        if order is None or order["status"] != "open":
            return _err(f"{order_id!r} is not an open order")
        order["status"] = "shipped"
        return _ok({"order_id": order_id, "status": "shipped"})

    def find_staff_by_name(self, name: str):
        if bad := _bad_str(name=name):
            return bad
        hits = [{"staff_id": k, **s} for k, s in self.staff.items() if s["name"].lower() == name.strip().lower()]
        return _ok(hits) if hits else _err(f"no staff member named {name!r}")

    def delete_order(self, order_id: str, staff_id: str):
        """A manager deletes an open order; its quantity goes back into stock."""
        if bad := _bad_str(order_id=order_id, staff_id=staff_id):
            return bad
        if self.staff.get(staff_id, {}).get("role") != "manager":
            return _err("permission denied: only a manager can delete orders")
        order = self.orders.get(order_id)
        if order is None or order["status"] != "open":
            return _err(f"{order_id!r} is not an open order")
        if order["sku"] in self.products:
            self.products[order["sku"]]["quantity"] += order["quantity"]
        del self.orders[order_id]
        self.audit_log.append({"op": "delete_order", "actor": staff_id, "target": order_id})
        return _ok({"deleted": order_id})
