"""Email to the scientist: one narrow seam, two real implementations — SMTP on the local
stack, Azure Communication Services in Azure — chosen by settings."""

from __future__ import annotations

import smtplib
from email.message import EmailMessage
from typing import Protocol

from pipeline.settings import Settings


class Mailer(Protocol):
    def send(self, message: EmailMessage) -> None:
        """Deliver one message (From, To, Subject and a text body are set)."""


class SmtpMailer:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port

    def send(self, message: EmailMessage) -> None:
        with smtplib.SMTP(self.host, self.port, timeout=30) as smtp:
            smtp.send_message(message)


class AcsMailer:
    """Azure Communication Services Email, reached with the app's managed identity."""

    def __init__(self, endpoint: str) -> None:
        from azure.communication.email import EmailClient
        from azure.identity import DefaultAzureCredential

        self.client = EmailClient(endpoint, DefaultAzureCredential())

    def send(self, message: EmailMessage) -> None:
        body = message.get_body(("plain",))
        payload = {
            "senderAddress": message["From"],
            "recipients": {"to": [{"address": message["To"]}]},
            "content": {
                "subject": message["Subject"],
                "plainText": body.get_content() if body else "",
            },
            "headers": {"Message-ID": message["Message-ID"]} if message["Message-ID"] else {},
        }
        self.client.begin_send(payload).result()


class NoMailer:
    """For deployments without email: completion is still recorded, nothing is sent."""

    def send(self, message: EmailMessage) -> None:
        return None


def mailer_for(settings: Settings) -> Mailer:
    if settings.mail_mode == "smtp":
        return SmtpMailer(settings.smtp_host, settings.smtp_port)
    if settings.mail_mode == "acs":
        return AcsMailer(settings.acs_endpoint)
    return NoMailer()
