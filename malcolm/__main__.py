from malcolm._entry import run

run()
