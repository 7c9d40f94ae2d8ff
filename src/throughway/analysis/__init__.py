"""Analyses (SDI, gates, lesioning, Hessian): see the issues that build them."""
