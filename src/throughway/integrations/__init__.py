"""Integrations with other training frameworks, each optional: importing one needs that framework
installed (`pip install throughway[lightning]`), and nothing else in throughway imports them."""
