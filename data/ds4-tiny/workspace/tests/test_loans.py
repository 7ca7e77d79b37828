import unittest

from src.books import Book
from src.loans import give_back, lend


class LoanTest(unittest.TestCase):
    def test_lend_twice(self):
        book = Book("Emma", "Jane Austen")
        lend(book)
        with self.assertRaises(ValueError):
            lend(book)

    def test_fee(self):
        book = Book("Emma", "Jane Austen")
        lend(book)
        fee = give_back(book, days_late=4)
        self.assertEqual(fee, 2.0)
