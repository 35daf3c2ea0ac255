"""Drafters: small files behind one interface (base.Drafter)."""
