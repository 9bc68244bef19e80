"""Resource quotas: what a namespace's live pods use, and the check that keeps them in bounds."""
