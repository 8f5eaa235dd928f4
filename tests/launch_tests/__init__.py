"""Tests of the launch package: backends, the trial harness, exporters."""
