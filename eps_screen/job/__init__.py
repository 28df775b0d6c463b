"""A GPU job: the engines of its process and how they share the card with training (engines), and whether the
job fits a GPU type at all (memory). The cell pipeline itself stays in eps_screen.pipeline."""
