"""Processes: run, wait for, stop and follow the output of local processes; free ports."""
