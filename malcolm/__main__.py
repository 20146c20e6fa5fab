from malcolm.cli import main

main()
