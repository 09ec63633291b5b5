"""Stock ledger for a small warehouse: items, movements, and what to reorder."""

from __future__ import annotations

import csv
import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

DEFAULT_LEAD_DAYS = 7
SAFETY_FACTOR = 1.5


class LedgerError(ValueError):
    """A row of the ledger file that cannot be read."""


@dataclass
class Item:
    sku: str
    name: str
    on_hand: int
    reorder_point: int
    lead_days: int = DEFAULT_LEAD_DAYS
    supplier: str = ""
    tags: list[str] = field(default_factory=list)

    def needs_reorder(self) -> bool:
        return self.on_hand <= self.reorder_point

    def shortfall(self) -> int:
        return max(0, self.reorder_point - self.on_hand)


@dataclass
class Movement:
    sku: str
    quantity: int
    when: dt.date
    reason: str = "adjustment"

    @property
    def is_inbound(self) -> bool:
        return self.quantity > 0


def parse_item(row: dict[str, str]) -> Item:
    try:
        on_hand = int(row["on_hand"])
        reorder_point = int(row.get("reorder_point") or 0)
        lead_days = int(row.get("lead_days") or DEFAULT_LEAD_DAYS)
    except (KeyError, ValueError) as exc:
        raise LedgerError(f"bad item row {row!r}: {exc}") from exc
    if reorder_point < 0:
        raise LedgerError(f"{row['sku']}: negative reorder point {reorder_point}")
    tags = [t.strip() for t in row.get("tags", "").split(";") if t.strip()]
    return Item(
        sku=row["sku"].strip(),
        name=row.get("name", "").strip(),
        on_hand=on_hand,
        reorder_point=reorder_point,
        lead_days=lead_days,
        supplier=row.get("supplier", "").strip(),
        tags=tags,
    )


def read_items(path: Path) -> dict[str, Item]:
    items: dict[str, Item] = {}
    with path.open(newline="") as handle:
        for line_number, row in enumerate(csv.DictReader(handle), start=2):
            try:
                item = parse_item(row)
            except LedgerError as exc:
                raise LedgerError(f"{path}:{line_number}: {exc}") from exc
            if item.sku in items:
                raise LedgerError(f"{path}:{line_number}: duplicate sku {item.sku}")
            items[item.sku] = item
    return items


def read_movements(path: Path) -> Iterator[Movement]:
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            yield Movement(
                sku=row["sku"].strip(),
                quantity=int(row["quantity"]),
                when=dt.date.fromisoformat(row["date"]),
                reason=row.get("reason", "adjustment"),
            )


def apply_movements(items: dict[str, Item], movements: Iterable[Movement]) -> list[str]:
    """Applies every movement in order; returns the skus that were unknown."""
    unknown: list[str] = []
    for movement in movements:
        item = items.get(movement.sku)
        if item is None:
            unknown.append(movement.sku)
            continue
        item.on_hand += movement.quantity
        if item.on_hand < 0:
            item.on_hand = 0
    return unknown


def daily_usage(movements: Iterable[Movement], sku: str, days: int = 30) -> float:
    cutoff = dt.date.today() - dt.timedelta(days=days)
    used = sum(-m.quantity for m in movements if m.sku == sku and not m.is_inbound and m.when >= cutoff)
    return used / days if days else 0.0


def suggest_reorder_point(usage_per_day: float, lead_days: int) -> int:
    return int(round(usage_per_day * lead_days * SAFETY_FACTOR))


def refresh_reorder_points(items: dict[str, Item], movements: list[Movement]) -> dict[str, int]:
    """Raises each item's reorder point to what recent usage asks for; returns the changes."""
    changed: dict[str, int] = {}
    for sku, item in items.items():
        suggested = suggest_reorder_point(daily_usage(movements, sku), item.lead_days)
        if suggested > item.reorder_point:
            changed[sku] = suggested
            item.reorder_point = suggested
    return changed


def reorder_list(items: dict[str, Item]) -> list[tuple[str, str, int]]:
    """(supplier, sku, units to order) for every item at or under its reorder point."""
    orders = []
    for item in items.values():
        if item.needs_reorder():
            units = item.shortfall() + item.reorder_point
            orders.append((item.supplier or "unassigned", item.sku, units))
    orders.sort()
    return orders


def write_report(items: dict[str, Item], path: Path) -> int:
    rows = reorder_list(items)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["supplier", "sku", "units", "on_hand", "reorder_point"])
        for supplier, sku, units in rows:
            item = items[sku]
            writer.writerow([supplier, sku, units, item.on_hand, item.reorder_point])
    return len(rows)


def main(ledger: Path, moves: Path, report: Path) -> None:
    items = read_items(ledger)
    movements = list(read_movements(moves))
    unknown = apply_movements(items, movements)
    changed = refresh_reorder_points(items, movements)
    count = write_report(items, report)
    print(f"{count} items to reorder, {len(changed)} reorder points raised")
    if unknown:
        print("unknown skus: " + ", ".join(sorted(set(unknown))))
