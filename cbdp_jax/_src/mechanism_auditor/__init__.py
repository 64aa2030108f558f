"""The mechanism auditor: a claim, a pair of neighbouring inputs, critics certified on held-out samples."""
