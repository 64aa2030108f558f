"""The one-run training audit: canaries inserted into one DP training, scored, and bounded."""
