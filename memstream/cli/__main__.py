from memstream.cli import main

main()
