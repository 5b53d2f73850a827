import sys

from memlab.course.doctor import doctor

if __name__ == "__main__":
    if sys.argv[1:2] not in ([], ["doctor"]):
        sys.exit(f"usage: python -m memlab doctor (got {sys.argv[1:]})")
    sys.exit(doctor())
