from jobs.main import main

main()
