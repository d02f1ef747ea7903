"""Taking work, on its own floor below the render: a same-shape batch claimed (claims), what a claim may start
(gate: budgets, deadlines), and the leases that fence each claimed unit (leases)."""
