"""Drivers as services: the HAL across a process boundary."""
