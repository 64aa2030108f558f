"""What privacy loss is measured in: f-divergences, the accountant's epsilon, neighbouring relations."""
