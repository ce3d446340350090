"""Notification campaigns: group sends through a messaging provider."""
