"""What a screen will run, cost and take, before anything is rented (the plan, its work, the estimate from
the measured figures, a job's memory, the wall clock), and what it did cost."""
