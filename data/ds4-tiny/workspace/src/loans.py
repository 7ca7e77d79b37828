"""Lending books out and taking them back."""

LOAN_DAYS = 21
LATE_FEE = 0.5


def lend(book, days=LOAN_DAYS):
    if book.on_loan:
        raise ValueError("already on loan")
    book.on_loan = True
    return days


def give_back(book, days_late=0):
    book.on_loan = False
    return days_late * LATE_FEE
