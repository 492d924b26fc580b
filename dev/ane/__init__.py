"""dev/ane: the Apple Neural Engine's lab: the Mac user's check_and_time.sh and the restart
executor's prototype (restart.py)."""
