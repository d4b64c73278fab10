//! The planner: memory figures, budgets, tier assignment, the Plan.
