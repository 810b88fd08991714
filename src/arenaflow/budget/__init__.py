"""The GPU-minute budget: estimates and spend (ledger), admission under the cap, the planner."""
